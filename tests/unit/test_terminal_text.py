"""What the terminal shows is text: control characters from files and records are escaped."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from kimideploy.cli.main import main
from kimideploy.cli.terminal import printable

CLIPBOARD = "\x1b]52;c;cm0gLXJmIH4=\x07"  # OSC 52: sets the clipboard to `rm -rf ~`
CLEAR = "\x9b2J"  # C1 CSI: clears the screen on a terminal that takes 8-bit controls


def test_printable_escapes_c0_c1_and_del_and_keeps_layout() -> None:
    assert printable(f"a{CLIPBOARD}b") == "a\\x1b]52;c;cm0gLXJmIH4=\\x07b"
    assert printable(f"x{CLEAR}\x7f\r") == "x\\x9b2J\\x7f\\x0d"
    assert printable("col\tumn\nnext line, ünïcode, 中文") == "col\tumn\nnext line, ünïcode, 中文"


def test_a_published_source_with_a_clipboard_sequence_is_shown_not_obeyed(
    edited_config: Callable[..., Path], capfd: pytest.CaptureFixture[str]
) -> None:
    """drafter list's table: a registry string someone else wrote reaches the terminal escaped;
    the JSON output carries the same value, escaped by JSON itself."""
    source = json.dumps(f"card {CLIPBOARD}{CLEAR}")  # YAML double quotes read JSON escapes
    published = (
        "    published: {mean_acceptance_length: {mt-bench: 3.3}, "
        f"num_speculative_tokens: 3, source: {source}}}\n"
    )
    config = str(edited_config(("  v3:\n", "  v3:\n" + published)))
    assert main(["--config", config, "drafter", "check", "v3"]) in (0, 1)
    out, err = capfd.readouterr()
    assert "\x1b" not in out + err and "\x9b" not in out + err and "\x07" not in out + err
    assert "card \\x1b]52;c;cm0gLXJmIH4=\\x07\\x9b2J" in out
    assert main(["--config", config, "drafter", "list", "-o", "json"]) == 0
    out, _ = capfd.readouterr()
    assert "\x1b" not in out and json.loads(out)  # JSON escapes it as \\u001b


def test_an_error_naming_a_hostile_path_is_escaped(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / f"x{CLIPBOARD}.yaml"
    assert main(["--config", str(missing), "config", "validate"]) == 2
    _, err = capfd.readouterr()
    assert "\x1b" not in err and "x\\x1b]52;c;" in err
