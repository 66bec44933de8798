"""Prompt files keep every prompt, and what cannot be a prompt is named by its row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kimideploy.errors import UsageError
from kimideploy.formats.prompts import PromptFileError, load_prompts
from kimideploy.services.drafters.doctor import read_prompts

SEPARATORS = ["\u2028", "\u2029", "\u0085", "\x1c", "\x1d", "\x1e", "\x0b", "\x0c"]


def jsonl(path: Path, rows: list[object], prefix: bytes = b"") -> Path:
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    path.write_bytes(prefix + text.encode())
    return path


@pytest.mark.parametrize("separator", SEPARATORS)
def test_a_prompt_holding_a_line_separator_stays_whole(tmp_path: Path, separator: str) -> None:
    prompt = f"first half{separator}second half"
    found = load_prompts(jsonl(tmp_path / "p.jsonl", [{"prompt": prompt}, {"prompt": "next"}]))
    assert found.bad == []
    assert [p.messages[-1]["content"] for p in found.prompts] == [prompt, "next"]


def test_a_byte_order_mark_and_windows_line_ends_cost_no_row(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"prompt": "a"}\r\n{"prompt": "b"}\r\n')
    found = load_prompts(path)
    assert found.bad == [] and [p.messages[0]["content"] for p in found.prompts] == ["a", "b"]


def test_openai_content_parts_are_joined_and_other_parts_refused_by_row(tmp_path: Path) -> None:
    parts = [{"type": "text", "text": "Explain "}, {"type": "text", "text": "MLA."}]
    image = [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]
    rows = [
        {"messages": [{"role": "user", "content": parts}]},
        {"messages": [{"role": "user", "content": image}]},
        {"messages": ["just a string"]},
        {"messages": [{"role": "user", "content": 5}]},
    ]
    found = load_prompts(jsonl(tmp_path / "p.jsonl", rows))
    assert [p.messages for p in found.prompts] == [[{"role": "user", "content": "Explain MLA."}]]
    assert found.bad == [
        "row 1: content part 0 is 'image_url': only text parts can be prompted",
        "row 2: turn 0 is a str, not an object",
        "row 3: content is a int, not text or a list of text parts",
    ]


def test_a_deeply_nested_row_is_a_bad_row_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "fine"}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    found = load_prompts(path)
    assert len(found.prompts) == 1 and found.bad == ["row 1: nested too deeply to be a prompt"]


def test_the_cli_names_an_unusable_file_with_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = jsonl(tmp_path / "bad.jsonl", [{"messages": [7]}])
    with pytest.raises(UsageError, match=r"no usable prompt \(row 0: turn 0 is a int") as info:
        read_prompts(bad)
    assert info.value.exit_code == 2
    import builtins

    real_import = builtins.__import__

    def no_pyarrow(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("pyarrow"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    parquet = tmp_path / "p.parquet"
    parquet.write_bytes(b"PAR1")
    with pytest.raises(PromptFileError, match="reading Parquet needs pyarrow"):
        load_prompts(parquet)
    with pytest.raises(UsageError, match="reading Parquet needs pyarrow"):
        read_prompts(parquet)
