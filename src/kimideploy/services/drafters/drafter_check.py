"""`kimideploy drafter check`: will vLLM load this drafter, for this target, at these layers?

Offline and in seconds, before a 25-minute load: the drafter's config.json and the safetensors
headers of its weights (read without torch) against the registry record and the target model.
Every problem says how to fix it. The team's 15% / 0.66x drafter would have failed three of these.
"""

from __future__ import annotations

from pathlib import Path

from kimideploy.config.drafters import HeldOutAcceptance, held_out_from_lineage
from kimideploy.config.project import Project
from kimideploy.errors import UsageError
from kimideploy.formats.check_result import CheckResult
from kimideploy.formats.drafter_files import LINEAGE_FILE, read_lineage
from kimideploy.formats.drafter_files import folder_findings as files_findings
from kimideploy.plan.calibration import CostModel
from kimideploy.plan.drafter_judgement import expected_files, method_findings, registry_findings
from kimideploy.plan.stack import stack_check


def check(
    project: Project,
    name: str,
    folder: Path | None,
    cluster: str | None = None,
    costs: CostModel | None = None,
    concurrency: int = 1,
) -> list[CheckResult]:
    """Registry findings for serving on `cluster` (default: the default cluster), and the files'
    when a local copy is given, judged by the vLLM of that cluster's serve image."""
    cluster_name = project.cluster_name(cluster)
    on_stack = stack_check(project, cluster_name, project.clusters[cluster_name].images.serve)
    stack = [on_stack] if on_stack is not None else []
    method = project.model_free_methods.get(name)
    if method is not None:
        if folder is not None:
            raise UsageError(
                f"--dir: {name} is a model-free method ({method.method}); it has no files",
                hint=f"run `kimideploy drafter check {name}` without --dir",
            )
        return stack + method_findings(
            project, name, method, cluster, costs=costs, concurrency=concurrency
        )
    drafter = project.eagle_drafter(name)
    held_out = lineage_held_out(folder) if folder is not None else None
    findings = registry_findings(
        project, name, drafter, cluster, costs=costs, concurrency=concurrency, held_out=held_out
    )
    if folder is not None:
        findings = files_findings(expected_files(project, drafter, cluster), folder) + findings
    return stack + findings


def lineage_held_out(folder: Path) -> HeldOutAcceptance | None:
    """The held-out judgement the drafter's training run wrote beside it, if any (a lineage file
    that cannot be read is reported by the files' own checks)."""
    lineage = read_lineage(folder / LINEAGE_FILE)
    try:
        return held_out_from_lineage(lineage) if lineage is not None else None
    except ValueError:
        return None  # the lineage finding names the shape problem
