"""Hostile or careless YAML: each is exit 2 with the file, the line and
what to do, never a traceback, in bounded time and memory; nothing in a value is executed."""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kimideploy.cli.main import main
from tests.conftest import EXAMPLE


def validate(capsys: pytest.CaptureFixture[str], path: Path, *extra: str) -> tuple[int, str]:
    code = main(["--config", str(path), *extra] if extra else ["--config", str(path), "config",
                                                                 "validate"])  # fmt: skip
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, err


def test_non_utf8_and_utf16_files_are_named_and_explained(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(EXAMPLE.read_bytes().replace(b"EXAMPLE PIN", b"EXAMPLE \xe9PIN", 1))
    code, err = validate(capsys, latin)
    line = next(i for i, t in enumerate(EXAMPLE.read_text().splitlines(), 1) if "EXAMPLE PIN" in t)
    assert code == 2 and f"latin.yaml:{line}: byte " in err and "is not UTF-8" in err
    wide = tmp_path / "wide.yaml"
    wide.write_bytes(EXAMPLE.read_text().encode("utf-16"))
    code, err = validate(capsys, wide)
    assert code == 2 and "wide.yaml: the file is UTF-16; save it as UTF-8" in err


def test_duplicate_keys_are_refused_with_both_lines(
    edited_config: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A second `name:` would make a new release; a second `v3:` silently drop the first drafter.
    path = edited_config(("name: kimi-k25 ", "name: kimi-k25\nname: kimi-k26 "))
    code, err = validate(capsys, path)
    assert code == 2 and "kimideploy.yaml:11: name: duplicate key (first on line 10)" in err
    text = EXAMPLE.read_text()
    v3 = text[text.index("  v3:\n") : text.index("\nclusters:") + 1]
    twice = tmp_path / "twice.yaml"
    twice.write_text(text.replace("\nclusters:", "\n" + v3 + "clusters:", 1))
    code, err = validate(capsys, twice)
    assert code == 2 and "drafters.v3: duplicate key (first on line" in err


def test_an_alias_bomb_is_refused_in_bounded_time_and_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")  # 10^9 strings once expanded, 9 lines of text
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    code, err = validate(capsys, bomb)
    assert code == 2 and "more than 200000 values once aliases are expanded" in err
    assert time.monotonic() - started < 5
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB


def test_deep_nesting_is_refused_not_a_recursion_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for depth in (100, 20_000):
        deep = tmp_path / f"deep-{depth}.yaml"
        deep.write_text("name: " + "[" * depth + "]" * depth + "\n")
        code, err = validate(capsys, deep)
        assert code == 2 and "nested" in err and "deep-" in err


def test_set_values_go_through_the_same_reader_and_execute_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "executed"
    for value, message in [
        ("[1", "the value is not a plain YAML value (invalid YAML"),
        (
            f'!!python/object/apply:os.system ["touch {marker}"]',
            "python/object/apply:os.system is not allowed",
        ),
        (f"!!python/object/apply:os.system touch {marker}", "could not determine a constructor"),
        ("{a: 1, a: 2}", "duplicate key"),
    ]:
        code = main(["render", "train", "--set", f"train.epochs={value}"])
        _, err = capsys.readouterr()
        assert code == 2 and message in err and "Traceback" not in err, err
    assert not marker.exists()


def test_set_overrides_get_the_cross_reference_checks_of_the_file(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--set train.drafter=v1` would make training move a pinned hub drafter aside."""
    assert main(["render", "train", "--set", "train.drafter=v1"]) == 2
    _, err = capsys.readouterr()
    assert "--set: clusters.rtx6000.workloads.train.drafter: drafter 'v1' has no source.path" in err
    assert main(["render", "train", "--set", "train.base_drafter=v9"]) == 2
    _, err = capsys.readouterr()
    assert "unknown drafter 'v9'" in err and "Traceback" not in err
