"""What a release's capture holds, read from its pods' /metrics (the capture sidecar appends its
own series, workloads/capture_proxy.py): `status` says whether capture is on and what it holds."""

from __future__ import annotations

from typing import Any

from kimideploy.formats.vllm_metrics import parse

PROMPTS = "kimideploy_capture_prompts"
DAYS = "kimideploy_capture_days"
SIZE = "kimideploy_capture_bytes"
RETENTION = "kimideploy_capture_retention_days"
OVER_CAP = "kimideploy_capture_over_cap_total"
INFO = "kimideploy_capture_info"


def capture_state(texts: dict[str, str], folder: str) -> dict[str, Any]:
    """Summed over the pods (each writes the same release folder, so the held figures are the
    most any pod reports, not their sum)."""
    held = dict.fromkeys((PROMPTS, DAYS, SIZE, RETENTION), 0.0)
    over_cap, oldest, reporting = 0.0, "", 0
    for text in texts.values():
        samples = parse(text)
        if PROMPTS not in samples:
            continue
        reporting += 1
        for name in held:
            held[name] = max(held[name], *samples.get(name, {(): 0.0}).values())
        over_cap += sum(samples.get(OVER_CAP, {}).values())
        for labels in samples.get(INFO, {}):
            day = dict(labels).get("oldest_day", "")
            oldest = min(oldest, day) if oldest and day else oldest or day
    if not reporting:
        return {"capture": f"on, into {folder} (no pod reported yet)"}
    since = f" since {oldest}" if oldest else ""
    text = (
        f"on: {int(held[PROMPTS]):,} prompts over {int(held[DAYS])} days{since} "
        f"({held[SIZE] / 1e6:.1f} MB) in {folder}, kept {int(held[RETENTION])} days"
    )
    if over_cap:
        text += f"; {int(over_cap):,} passed unrecorded over the daily cap"
    return {"capture": text, "capture_prompts": int(held[PROMPTS])}
