"""The workloads kimideploy renders, by name: the one list the config, the resolver, the pods'
entry point and the CLI's choices read (no pydantic here, so the CLI can import it at start-up)."""

from __future__ import annotations

SERVE = "serve"
JOB_WORKLOADS = ("datagen", "extract", "vocab", "train", "bench")
"""Each run is a new, immutable Job."""
PUBLISH = "publish"
"""`drafter publish` and `data publish`: a Job, though not one `run` starts."""
REPLAY = "replay"
"""`drafter doctor` and `drafter check --replay`: a Job, though not one `run` starts."""
PULL = "pull"
"""`drafter pull` and `host sync-model`: a Job that fetches published drafters onto a cluster's
models volume ahead of serving, though not one `run` starts."""
WEIGHTS = "weights"
"""`host sync-model` on a cluster whose pods mount a shared models claim (the rented NVL8
clusters): a Job downloads the pinned revision into that claim, though not one `run` starts."""
WORKLOAD_NAMES = (*JOB_WORKLOADS, PUBLISH, REPLAY, PULL, WEIGHTS, SERVE)
GPU_WORKLOADS = frozenset({SERVE, "extract", "train"})
"""datagen and bench are clients of a serve release; vocab counts tokens on CPU."""
