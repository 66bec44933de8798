"""drafter-check: the serve pod's init container, checking the drafter on the models volume.

Reads the serve spec the renderer wrote and the drafter directory the pod mounts, and fails in
seconds (exit 2, each problem with its fix in the log) instead of after a 25-minute model load:
the same checks as `kimideploy drafter check --dir`, on the copy vLLM is about to load.
"""

from __future__ import annotations

from pathlib import Path

from kimideploy.config.specs import ServeSpec
from kimideploy.formats.drafter_files import Expected, folder_findings
from kimideploy.workloads.runtime import EXIT_BAD_INPUT, EXIT_OK, emit, log


def run(spec: ServeSpec) -> int:
    if spec.drafter_path is None or spec.layers is None:
        log("no drafter: nothing to check")
        return EXIT_OK
    expected = Expected(
        target_repo=spec.target.repo,
        target_revision=spec.target.revision,
        hidden_size=spec.target.hidden_size,
        vocab_size=spec.target.vocab_size,
        num_hidden_layers=spec.target.num_hidden_layers,
        layer_ids=list(spec.layers.ids),
        convention=spec.layers.convention,
        vllm_layer_ids=list(spec.layers.vllm_ids),
        draft_vocab_size=spec.draft_vocab_size or 0,
        num_speculative_tokens=spec.num_speculative_tokens or 0,
        vllm_version=spec.vllm_version or "0.32.0",
        decoder=spec.decoder,
        image_patches=tuple(spec.image_patches),
    )
    findings = folder_findings(expected, Path(spec.drafter_path))
    for finding in findings:
        fix = f" -> fix: {finding.fix}" if not finding.ok else ""
        log(f"{finding.status:4} {finding.name}: {finding.detail}{fix}")
    emit(
        {
            "event": "result",
            "stage": "drafter-check",
            "drafter": spec.drafter,
            "path": spec.drafter_path,
            "findings": [
                {"check": f.name, "status": f.status, "detail": f.detail} for f in findings
            ],
        }
    )
    blocking = [f for f in findings if not f.ok and f.blocking]
    if blocking:
        log(
            f"drafter {spec.drafter} at {spec.drafter_path}: {len(blocking)} blocking problem(s) "
            f"({', '.join(f.name for f in blocking)}); not starting a model load that would fail"
        )
        return EXIT_BAD_INPUT
    return EXIT_OK
