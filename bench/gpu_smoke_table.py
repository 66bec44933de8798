"""The one table scripts/gpu-smoke ends with: what each step did and each figure it printed.

Read from the run's own record: `steps.tsv` (the script writes one line per step: section,
exit status or `skipped`, seconds, its limit) and the log of everything the steps printed. Each
step's figures are found by the lines its program prints (gpucheck's `gpu-check: ok|FAIL NAME:
...`, train_precision's `train PRECISION: {json}`, the fine-tune's, the step-time ratio,
train_vs_speculators' ratio or its one-sided line, weight_readers' rows), so a step that failed
still shows what it measured before it stopped, and a figure that is missing reads as missing.

    python bench/gpu_smoke_table.py --log WORK/gpu-smoke.log --steps WORK/steps.tsv
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

PROBE = re.compile(r"^gpu-check: (ok  |FAIL) ([\w-]+): (.*)$")
TRAIN = re.compile(r"^train (fp32|bf16): (\{.*\})$")
TRAIN_FAILED = re.compile(r"^train (fp32|bf16)(?: without the held-out judgement)?: FAILED")
FINETUNE = re.compile(r"^fine-tune of a bf16 base drafter(?: \(bf16\))?: (.*)$")
STEP_RATIO = re.compile(r"^step time fp32 / bf16 on this (\w+): ([\d.]+)x")
VERSUS = re.compile(r"^steps/s, kimideploy / speculators: ([\d.]+)x")
OURS_ALONE = re.compile(r"^kimideploy: (\d+) steps, ([\d.]+) steps/s")
READER = re.compile(r"^(lazy|prefetch|eager)\s+(cold|warm)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$")
MAX_FIGURE = 90


@dataclass(frozen=True)
class Row:
    step: str
    what: str
    result: str
    figure: str


def step_rows(steps: str) -> list[Row]:
    rows = []
    for line in steps.splitlines():
        section, rc, seconds, limit = line.split("\t")
        number = section.split(".", 1)[0] if section[:1].isdigit() else section
        if rc == "skipped":
            rows.append(Row(number, "step", "skipped", ""))
            continue
        result = "ok" if rc == "0" else ("timeout" if rc in ("124", "137") else f"FAIL ({rc})")
        rows.append(Row(number, "step", result, f"{seconds} s of {limit} s"))
    return rows


def _train_figure(found: dict[str, object]) -> str:
    held = found.get("held_out") or {}
    deepest = max(held, key=int) if isinstance(held, dict) and held else None
    text = (
        f"{found.get('seconds_per_step')} s/step, loss {found.get('first_loss')} -> "
        f"{found.get('last_loss')}"
    )
    if deepest is not None and isinstance(held, dict):
        text += f", held-out k={deepest} {held[deepest]}"
    return text


def figure_rows(log: str) -> list[Row]:
    """Every figure the steps printed, in the order they printed it."""
    rows: list[Row] = []
    for line in log.splitlines():
        line = line.rstrip()
        if found := PROBE.match(line):
            ok, name, message = found.groups()
            rows.append(Row("1", f"probe {name}", ok.strip(), message))
        elif found := TRAIN.match(line):
            precision, figures = found.groups()
            rows.append(Row("2", f"train {precision}", "ok", _train_figure(json.loads(figures))))
        elif found := TRAIN_FAILED.match(line):
            rows.append(Row("2", f"train {found.group(1)}", "FAIL", line.split(": ", 1)[0]))
        elif found := FINETUNE.match(line):
            text = found.group(1)
            if text.startswith("FAILED"):
                rows.append(Row("2", "fine-tune bf16 base", "FAIL", ""))
            else:
                figure = _train_figure(json.loads(text))
                rows.append(Row("2", "fine-tune bf16 base", "ok", figure))
        elif found := STEP_RATIO.match(line):
            device, ratio = found.groups()
            rows.append(Row("2", f"step time fp32 / bf16 ({device})", "ok", f"{ratio}x"))
        elif found := VERSUS.match(line):
            rows.append(Row("3", "steps/s kimideploy / speculators", "ok", f"{found[1]}x"))
        elif found := OURS_ALONE.match(line):
            steps, rate = found.groups()
            figure = f"{steps} steps, {rate} steps/s (speculators needs a GPU)"
            rows.append(Row("3", "kimideploy alone", "ok", figure))
        elif found := READER.match(line):
            reader, cache, seconds, rate, relative = found.groups()
            figure = f"{seconds} s, {rate} GB/s, {relative}x the first"
            rows.append(Row("4", f"weights {reader} {cache}", "ok", figure))
    return rows


def table(steps: str, log: str) -> str:
    """Per step: its own line (result, seconds), then the figures it printed."""
    figures = figure_rows(log)
    ordered: list[Row] = []
    for step in step_rows(steps):
        ordered.append(step)
        ordered.extend(row for row in figures if row.step == step.step)
    # A step the script stopped is its own row's `timeout` (steps.tsv), not a figure.
    ordered.extend(row for row in figures if row.step not in {r.step for r in ordered})
    header = Row("STEP", "WHAT", "RESULT", "FIGURE")
    cells = [(r.step, r.what, r.result, r.figure[:MAX_FIGURE]) for r in [header, *ordered]]
    widths = [max(len(c[i]) for c in cells) for i in range(3)]
    return "\n".join(
        f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:<{widths[2]}}  {d}".rstrip()
        for a, b, c, d in cells
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--steps", type=Path, required=True)
    args = parser.parse_args(argv)
    steps = args.steps.read_text() if args.steps.is_file() else ""
    log = args.log.read_text(errors="replace") if args.log.is_file() else ""
    if not steps:
        print(f"gpu-smoke: no step ran ({args.steps} is empty)", file=sys.stderr)
        return 1
    print("\n=== the run, one table")
    print(table(steps, log))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
