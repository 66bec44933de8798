"""`-o yaml` wherever `-o json` exists, the same document; shell completion through click's own
mechanism, as docs/reference/cli.md documents it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kimideploy.cli.main import main
from tests.conftest import EXAMPLE, REPO

KIMIDEPLOY = Path(sys.executable).parent / "kimideploy"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(list(args))
    return code, capsys.readouterr().out


@pytest.mark.parametrize(
    "command",
    [("drafter", "list"), ("image", "list"), ("drafter", "check", "v3"), ("config", "validate"),
     ("host", "inventory"), ("image", "render", "vllm-0.32-kimi")],
)  # fmt: skip
def test_yaml_and_json_print_the_same_document(
    capsys: pytest.CaptureFixture[str], command: tuple[str, ...]
) -> None:
    code_json, as_json = run(capsys, *command, "-o", "json")
    code_yaml, as_yaml = run(capsys, *command, "-o", "yaml")
    assert code_json == code_yaml
    assert yaml.safe_load(as_yaml) == json.loads(as_json)
    assert not as_yaml.lstrip().startswith(("{", "["))  # block YAML, not JSON


def test_the_read_commands_documents_carry_what_their_text_says(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out = run(capsys, "config", "validate", "-o", "json")
    assert code == 0 and json.loads(out)["valid"] is True and "b300" in json.loads(out)["clusters"]
    code, out = run(capsys, "image", "render", "vllm-0.32-kimi", "-o", "json")
    assert json.loads(out)["dockerfile"] == (REPO / "Dockerfile").read_text()
    code, as_text = run(capsys, "image", "render", "vllm-0.32-kimi")
    assert as_text == (REPO / "Dockerfile").read_text()  # the default is the Dockerfile itself
    code, out = run(capsys, "host", "inventory", "--cluster", "rtx6000")
    assert code == 0 and "hostvars" in json.loads(out)["_meta"]  # ansible-inventory's shape


def complete(*words: str, config: str = str(EXAMPLE)) -> list[str]:
    env = {**os.environ, "COMP_WORDS": " ".join(words), "COMP_CWORD": str(len(words) - 1),
           "_KIMIDEPLOY_COMPLETE": "bash_complete", "KIMIDEPLOY_CONFIG": config}  # fmt: skip
    done = subprocess.run([str(KIMIDEPLOY)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [line.split(",", 1)[1] for line in done.stdout.splitlines() if "," in line]


def test_shell_completion_offers_commands_workloads_and_choices() -> None:
    script = subprocess.run([str(KIMIDEPLOY)], env={**os.environ, "_KIMIDEPLOY_COMPLETE":
                            "bash_source"}, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert "_kimideploy_completion()" in script.stdout and "complete -o" in script.stdout
    assert {"up", "run", "rollback", "calibrate", "status"} <= set(complete("kimideploy", ""))
    assert complete("kimideploy", "run", "") == [
        "datagen", "extract", "vocab", "train", "bench", "calibrate",
    ]  # fmt: skip
    assert complete("kimideploy", "calibrate", "show", "-o", "") == [
        "table",
        "wide",
        "json",
        "yaml",
        "png",
    ]
    assert complete("kimideploy", "up", "serve", "-o", "") == ["prose", "json", "yaml"]


def test_the_completion_command_prints_the_script_and_names_complete_from_the_project() -> None:
    printed = subprocess.run([str(KIMIDEPLOY), "completion", "bash"], capture_output=True,
                             text=True, timeout=60)  # fmt: skip
    protocol = subprocess.run([str(KIMIDEPLOY)], env={**os.environ, "_KIMIDEPLOY_COMPLETE":
                              "bash_source"}, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert printed.returncode == 0 and printed.stdout == protocol.stdout
    assert complete("kimideploy", "up", "serve", "--cluster", "b") == ["b200", "b300"]
    assert {"v3", "ngram", "none"} <= set(complete("kimideploy", "up", "serve", "--drafter", ""))
    assert "none" not in complete("kimideploy", "drafter", "check", "")
    assert "v3" in complete("kimideploy", "drafter", "doctor", "")
    # A project file that cannot be read offers no names and never breaks the shell.
    assert complete("kimideploy", "up", "serve", "--cluster", "b", config="/nonexistent") == []


def test_an_outcome_has_every_key_of_its_command_and_refuses_others() -> None:
    from kimideploy.cli.outcome import RELEASE_KEYS, RUN_KEYS, expect

    assert expect("up serve", "prose", RELEASE_KEYS) is None
    pending = expect("run train", "json", RUN_KEYS)
    assert pending is not None
    document = pending.document(0, "complete", "done", None, facts={"run": {"id": "abc123"}})
    assert list(document)[7:] == list(RUN_KEYS)
    assert document["comparison"] is None and document["run"] == {"id": "abc123"}
    with pytest.raises(ValueError, match="revision"):
        pending.document(4, "failed", "x", None, facts={"revision": 3})


def test_a_failure_before_the_command_ran_prints_no_outcome(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out = run(capsys, "up", "serve", "--drafter", "v3", "--bogus", "-o", "json")
    assert code == 2 and out == ""  # click refused the line: no command, so no outcome


def test_a_refusal_is_an_outcome_document_with_its_exit_code(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)  # no ./kimideploy.yaml: the implicit example, which up refuses
    monkeypatch.delenv("KIMIDEPLOY_CONFIG", raising=False)
    code, out = run(capsys, "up", "serve", "--drafter", "v3", "-o", "json")
    document = json.loads(out)
    assert code == 2 and document["exit_code"] == 2 and document["ok"] is False
    assert document["status"] == "refused" and "built-in example" in document["reason"]
    assert document["hint"].startswith("create ./kimideploy.yaml")
    assert document["revision"] is None and document["command"] == "up serve"


def every_error_class() -> list[type[Exception]]:
    import kimideploy.errors as errors_module

    found: list[type[Exception]] = []
    todo: list[type[Exception]] = [errors_module.KimiDeployError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return found


def test_every_error_class_is_restated_with_its_own_fields_and_exit_code() -> None:
    """What a caller adds to an error (the revision that was rejected, the overlay it came from)
    keeps the error's class, exit code and own fields; no class is rebuilt through a
    constructor it does not have (a ConfigError takes `issues`)."""
    import importlib
    import pkgutil

    import kimideploy
    from kimideploy import errors

    # Every module that may define an error class (the pods' workloads/ has its own BadInputError).
    for module in pkgutil.walk_packages(kimideploy.__path__, "kimideploy."):
        if not module.name.startswith(("kimideploy.workloads", "kimideploy.__main__")):
            importlib.import_module(module.name)

    classes = every_error_class()
    assert errors.ConfigError in classes and len(classes) >= 8
    for cls in classes:
        original = cls.__new__(cls)
        errors.KimiDeployError.__init__(original, "inner", "the hint", {"release": "r"})
        if isinstance(original, errors.ConfigError):
            original.issues = ["kimideploy.yaml:3: name: required"]
        again = original.restated("outer: inner", outcome={"revision": 4})
        assert type(again) is cls and again.exit_code == original.exit_code
        assert again.message == str(again) == "outer: inner" and again.hint == "the hint"
        assert again.outcome == {"release": "r", "revision": 4}
        assert original.message == "inner" and original.outcome == {"release": "r"}
        if isinstance(original, errors.ConfigError):
            assert again.issues == ["kimideploy.yaml:3: name: required"]


def test_a_failures_facts_are_keys_the_outcome_document_has() -> None:
    """OutcomeFacts (what services attach to an error) is typed; each of its keys is one the
    documented outcome of some command carries, so none is dropped or invents a key."""
    from kimideploy.cli import outcome
    from kimideploy.errors import OutcomeFacts

    documented = {key for name in dir(outcome) if name.endswith("_KEYS")
                  for key in getattr(outcome, name)}  # fmt: skip
    assert set(OutcomeFacts.__annotations__) <= documented | {"status"}


@pytest.mark.parametrize(
    "command", [("drafter", "list"), ("image", "list"), ("plan", "requirements")]
)
def test_tables_fit_the_terminal_and_wide_shows_every_cell_whole(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: tuple[str, ...]
) -> None:
    """On an 80-column terminal every line fits (cut cells end in '~', columns past the width are
    left out, a last line says so); `-o wide`, and a pipe even with $COLUMNS set (a CI runner's),
    print every cell whole."""
    from kimideploy.cli import table

    terminal = table._terminal_columns
    monkeypatch.setattr(table, "_terminal_columns", lambda: 80)
    code, fitted = run(capsys, *command)
    assert code == 0 and max(len(line) for line in fitted.splitlines()) <= 80, fitted
    assert fitted.rstrip().endswith("every cell whole)")
    code, wide = run(capsys, *command, "-o", "wide")
    assert code == 0 and max(len(line) for line in wide.splitlines()) > 80
    assert "every cell whole" not in wide and "~" not in wide.splitlines()[1]
    monkeypatch.setattr(table, "_terminal_columns", terminal)
    monkeypatch.setenv("COLUMNS", "80")
    code, piped = run(capsys, *command)  # capsys is no terminal: a pipe's whole table
    assert piped == wide


def test_the_drafter_table_keeps_its_status_at_80_columns(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from kimideploy.cli import table

    monkeypatch.setattr(table, "_terminal_columns", lambda: 80)
    _, fitted = run(capsys, "drafter", "list")
    header = fitted.splitlines()[0].split()
    assert header[0] == "NAME" and "STATUS" in header and "METHOD" in header
    assert "rejected" in fitted  # v2's status, whole
