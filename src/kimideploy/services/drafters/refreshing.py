"""`kimideploy drafter refresh NAME --capture DIR`: the prompts a refresh of drafter NAME learns
from, chosen from a release's captured traffic (plan/refresh.py says how), written with their
lineage for datagen to answer again on the non-speculative target, and the held-out ones kept
apart for the judgement. Nothing is sent to a cluster: the folder is a copy of the release's
`capture/<release>/` day files (or the datasets volume itself, mounted)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kimideploy.config.loading import LoadedProject
from kimideploy.errors import UsageError
from kimideploy.plan import refresh

PROMPTS_FILE = "prompts.jsonl"
HELD_OUT_FILE = "held-out.jsonl"
SUMMARY_FILE = "refresh.json"


@dataclass(frozen=True)
class RefreshAsk:
    drafter: str
    capture: Path
    out: Path
    max_prompts: int
    held_out_fraction: float = refresh.HELD_OUT_FRACTION


def read_capture(folder: Path) -> tuple[list[dict[str, Any]], int]:
    """Every record of the day files; (records, lines that were not one)."""
    if not folder.is_dir():
        raise UsageError(
            f"no capture folder at {folder}",
            hint="copy the release's capture/<release>/ folder from the datasets volume, or "
            "point --capture at it where the volume is mounted",
        )
    files = sorted(folder.glob("*.jsonl"))
    if not files:
        raise UsageError(
            f"{folder} holds no captured day files (*.jsonl)",
            hint="capture is on where `kimideploy status` says so (serve.capture)",
        )
    rows, bad = [], 0
    for path in files:
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                bad += 1
                continue
            if isinstance(row, dict):
                rows.append(row)
            else:
                bad += 1
    return rows, bad


def choose(loaded: LoadedProject, ask: RefreshAsk) -> dict[str, Any]:
    """Write the chosen prompts, the held-out ones and the summary into `ask.out`; refuses an
    output folder that holds a refresh already (nothing is overwritten)."""
    project = loaded.project
    if ask.drafter not in project.eagle_drafters:
        raise UsageError(
            f"drafter {ask.drafter!r} is not an EAGLE-3 drafter of {loaded.path}",
            hint=f"refresh one of: {', '.join(sorted(project.eagle_drafters)) or 'none declared'}",
        )
    rows, bad = read_capture(ask.capture)
    conversations = refresh.grouped(rows)
    chosen = refresh.select(
        conversations, max_prompts=ask.max_prompts, held_out_fraction=ask.held_out_fraction
    )
    if not chosen.train:
        raise UsageError(
            f"none of the {len(conversations)} captured conversations carries its acceptance",
            hint="the release must serve a drafter with serve.per_request_spec_metrics on",
        )
    written = [ask.out / name for name in (PROMPTS_FILE, HELD_OUT_FILE, SUMMARY_FILE)]
    if any(path.exists() for path in written):
        raise UsageError(
            f"{ask.out} holds a refresh already",
            hint="choose another --out (a refresh is never overwritten)",
        )
    ask.out.mkdir(parents=True, exist_ok=True)
    summary = {
        "drafter": ask.drafter,
        "capture": str(ask.capture),
        "records": len(rows),
        "unreadable_lines": bad,
        "requests": chosen.requests,
        "conversations": len(conversations),
        "unranked": chosen.unranked,
        "chosen": len(chosen.train),
        "held_out": len(chosen.held_out),
        "held_out_fraction": ask.held_out_fraction,
        "held_out_rule": f"sha256('{refresh.REFRESH_SALT}:' + key) < fraction of 2**64",
        "rejected_draft_tokens_covered": round(chosen.rejected_covered, 4),
        "rank": "draft tokens the serving drafter rejected, over every request of it",
    }
    written[0].write_text(refresh.jsonl(refresh.prompt_rows(chosen.train, chosen.requests)))
    written[1].write_text(refresh.jsonl(refresh.prompt_rows(chosen.held_out, chosen.requests)))
    written[2].write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return {**summary, "top": [_row(c, chosen.requests) for c in chosen.train[:10]]}


def _row(conversation: refresh.CapturedConversation, requests: int) -> dict[str, Any]:
    rate = conversation.acceptance_rate
    return {
        "key": conversation.key,
        "requests": conversation.requests,
        "share": f"{conversation.requests / requests:.1%}" if requests else "-",
        "acceptance": f"{rate:.1%}" if rate is not None else "-",
        "rejected": conversation.rejected,
    }
