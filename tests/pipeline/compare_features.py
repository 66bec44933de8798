"""`python compare_features.py OURS REFERENCE`: one JSON line comparing two extract outputs sample by
sample (run with the CPU vLLM venv's python: it needs torch and safetensors)."""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file


def main(ours: Path, reference: Path) -> dict[str, object]:
    mine = {p.name: p for p in sorted(ours.glob("shard-*/*.safetensors"))}
    theirs = {p.name: p for p in sorted(reference.glob("shard-*/*.safetensors"))}
    worst, problems = 0.0, []
    for name in sorted(mine.keys() & theirs.keys()):
        a, b = load_file(str(mine[name])), load_file(str(theirs[name]))
        for key in ("input_ids", "loss_mask"):
            if not torch.equal(a[key], b[key]):
                problems.append(f"{name}: {key} differ")
        for key in ("aux_hidden_states", "last_hidden_state"):
            if a[key].shape != b[key].shape:
                problems.append(f"{name}: {key} {list(a[key].shape)} vs {list(b[key].shape)}")
                continue
            scale = float(b[key].abs().max())
            worst = max(worst, float((a[key] - b[key]).abs().max()) / scale)
    return {
        "samples": len(mine),
        "reference_samples": len(theirs),
        "same_names": mine.keys() == theirs.keys(),
        "max_relative_error": worst,
        "problems": problems[:5],
    }


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), Path(sys.argv[2]))))
