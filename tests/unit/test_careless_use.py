"""Careless use: the implicit built-in example never reaches a cluster or a host,
KIMIDEPLOY_CONFIG is honoured, read-only commands say they use the example, and a zero timeout is
refused. Each is exit 2 with a hint and no traceback; nothing is contacted."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kimideploy.cli.main import main
from kimideploy.cli.terminal import TerminalReporter
from kimideploy.errors import UsageError


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder without kimideploy.yaml, no config in the environment, no kubeconfig."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KIMIDEPLOY_CONFIG", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    return tmp_path


@pytest.mark.parametrize(
    ("args", "change"),
    [
        (["up", "serve", "--drafter", "v3", "--yes"], "up changes a cluster"),
        (["rollback", "serve", "--no-spec", "--yes"], "rollback changes a cluster"),
        (["down", "serve", "--yes"], "down changes a cluster"),
        (["run", "train", "--cluster", "b300"], "run train creates a Job on a cluster"),
        (["watch", "serve", "--act"], "watch --act may roll a cluster back"),
        (["host", "provision", "--cluster", "rtx6000"], "host provision changes hosts"),
        (["host", "sync-model", "--cluster", "rtx6000"], "host sync-model writes to hosts"),
        (["image", "lock", "tools", "--digest", "sha256:" + "a" * 64], "image lock edits"),
    ],
)
def test_changing_commands_refuse_the_implicit_example(
    elsewhere: Path, capsys: pytest.CaptureFixture[str], args: list[str], change: str
) -> None:
    code = main(args)
    _, err = capsys.readouterr()
    assert code == 2, err
    assert f"error: {change}" in err and "this would use the built-in example" in err
    assert "hint: create ./kimideploy.yaml" in err and "KIMIDEPLOY_CONFIG" in err
    assert "Traceback" not in err


def test_read_only_commands_say_they_use_the_example(
    elsewhere: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["drafter", "list", "-o", "json"]) == 0
    _, err = capsys.readouterr()
    assert "(using the built-in example" in err
    assert (
        main(["up", "serve", "--drafter", "v3", "--dry-run"]) == 0
    )  # a client dry run changes nothing
    capsys.readouterr()


def test_kimideploy_config_is_honoured(
    edited_config: Callable[..., Path], elsewhere: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    path = edited_config(("name: kimi-k25 ", "name: mine "))
    monkeypatch.setenv("KIMIDEPLOY_CONFIG", str(path))
    assert main(["render", "serve"]) == 0
    out, err = capsys.readouterr()
    assert "name: mine-serve" in out and "built-in example" not in err


def test_a_zero_timeout_is_refused(elsewhere: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for command in (["up", "serve", "--timeout", "0"], ["rollback", "serve", "--timeout", "0"]):
        assert main(command) == 2
        _, err = capsys.readouterr()
        assert "--timeout" in err and "0 is not in the range x>=1" in err


def test_a_confirmation_without_a_terminal_is_a_refusal() -> None:
    with pytest.raises(UsageError, match="needs a yes, and there is no terminal") as caught:
        TerminalReporter(interactive=False).confirm("apply revision 3?")
    assert caught.value.exit_code == 2 and "--yes" in (caught.value.hint or "")
