"""`python -m kimideploy.workloads NAME --spec PATH`."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from kimideploy.config import specs
from kimideploy.config.workload_names import JOB_WORKLOADS, PUBLISH, SERVE
from kimideploy.errors import ExitCode, KimiDeployError
from kimideploy.workloads.runtime import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    load_spec,
    log,
    require_writable,
)

# Every job workload; the serve pod's drafter-check, which reads the serve spec; artifact-pull,
# which reads the common part of whichever workload's spec its pod has; the replay's two stages.
WORKLOADS: dict[str, type[specs.WorkloadSpec]] = {
    **{name: specs.SPEC_TYPES[name] for name in (*JOB_WORKLOADS, PUBLISH)},
    "drafter-check": specs.SPEC_TYPES[SERVE],
    # The serve pod's capture sidecar (serve.capture), which reads the serve spec too.
    "capture-proxy": specs.SPEC_TYPES[SERVE],
    "artifact-pull": specs.WorkloadSpec,
    "weights": specs.WeightsSpec,
    # The replay Job's two containers (`drafter doctor`): the serving engine, then the judgement.
    "replay-capture": specs.ReplaySpec,
    "replay-judge": specs.ReplaySpec,
}


def written_folders(workload: str, spec: specs.WorkloadSpec) -> list[str]:
    """What this pod writes: the workload's outputs, or where artifact-pull puts what it pulls.
    The serve pod's drafter check and the replay's judgement write nothing."""
    if workload == "artifact-pull":
        return [str(Path(pull.dest).parent) for pull in spec.pulls]
    if workload in ("drafter-check", "replay-judge"):
        return []
    return spec.written_folders()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kimideploy.workloads")
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("--spec", type=Path, default=Path(specs.SPEC_PATH))
    args = parser.parse_args(argv)
    try:
        spec = load_spec(args.spec, WORKLOADS[args.workload])
        require_writable(written_folders(args.workload, spec))
        module = importlib.import_module(f"kimideploy.workloads.{args.workload.replace('-', '_')}")
        code: int = module.run(spec)
        return code
    except KimiDeployError as exc:  # BadInputError, or a shared module's usage error
        log(f"error: {exc.message}")
        if exc.hint:
            log(f"hint: {exc.hint}")
        return EXIT_BAD_INPUT if exc.exit_code == ExitCode.USAGE else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
