"""Facts kept in one place: each reader derives from it, so these agree by construction
and a new workload or a renamed release cannot leave one reader behind."""

from __future__ import annotations

import json

import click
import pytest

from kimideploy.cli.run_cmds import JOB_CHOICE
from kimideploy.cli.state import WORKLOAD_CHOICE
from kimideploy.config.loading import LoadedProject, load_project_text
from kimideploy.config.specs import SPEC_TYPES
from kimideploy.config.workload_names import JOB_WORKLOADS, WORKLOAD_NAMES
from kimideploy.plan.model import PlanRequest
from kimideploy.plan.overrides import apply_overrides
from kimideploy.plan.resolve import resolve
from kimideploy.workloads.__main__ import WORKLOADS


def test_every_workload_has_one_spec_model_and_the_cli_offers_exactly_those() -> None:
    assert set(SPEC_TYPES) == set(WORKLOAD_NAMES)
    assert list(WORKLOAD_CHOICE.choices) == list(WORKLOAD_NAMES)
    assert list(JOB_CHOICE.choices) == [*JOB_WORKLOADS, "calibrate"]
    assert set(WORKLOADS) == {*JOB_WORKLOADS, "publish", "drafter-check", "artifact-pull",
                              "replay-capture", "replay-judge", "weights", "capture-proxy"}  # fmt: skip
    assert isinstance(WORKLOAD_CHOICE, click.Choice)


@pytest.mark.parametrize("workload", WORKLOAD_NAMES)
def test_the_plan_carries_its_spec_and_the_release_names(
    example: LoadedProject, workload: str
) -> None:
    if workload == "pull":  # a pull needs a drafter published (pinned by digest)
        example = with_published_drafter(example)
    drafter = "v4" if workload == "pull" else None
    run_id = None if workload == "serve" else "abc123"
    cluster = "b300" if workload == "weights" else "rtx6000"  # a shared models claim
    plan = resolve(example, PlanRequest(workload, cluster, drafter, run_id=run_id))
    assert type(plan.spec) is SPEC_TYPES[workload]
    assert plan.release == example.project.release_name(workload)
    assert plan.serve_release == example.project.release_name("serve")
    # what the pod reads is what services read from the plan
    spec_json = next(
        o.values["data"]["spec.json"]
        for o in plan.objects
        if "spec.json" in o.values.get("data", {})
    )
    assert plan.spec.model_dump(mode="json") == json.loads(spec_json)


def with_published_drafter(example: LoadedProject) -> LoadedProject:
    anchor = "      base_drafter: v1\n      dataset: datasets/synthetic-v3\n"
    entry = ("  v4:\n    source: {oci: {repository: ghcr.io/kimideploy/artifacts/drafters/v4, "
             f"digest: 'sha256:{'a' * 64}', files: {{config.json: {'b' * 64}}}}}}}\n"
             "    aux_layer_ids: [2, 30, 58]\n    layer_id_convention: vllm\n    status: trained\n"
             "    lineage: {trained_for: moonshotai/Kimi-K2.5}\n")  # fmt: skip
    text = example.path.read_text()
    assert text.count(anchor) == 1
    return load_project_text(text.replace(anchor, anchor + entry), example.path)


# Fields the plan derives although the settings have one of the same name.
DERIVED = {
    "datagen": {"prompts", "endpoint", "concurrency"},  # unset: what the serve release holds
    "bench": {"concurrency"},
    # ttt_steps: unset means the drafter's k (at least 3); an explicit value is copied (below).
    "train": {"drafter", "online", "ttt_steps"},
}


@pytest.mark.parametrize("workload", JOB_WORKLOADS)
def test_job_specs_carry_every_setting_of_the_same_name(
    example: LoadedProject, workload: str
) -> None:
    overrides = {
        "datagen": ("datagen.top_p=0.5", "datagen.chunk_samples=7"),
        "extract": ("extract.backend=transformers",),
        "vocab": (),
        "train": (
            "train.seed=11",
            "train.lr=0.003",
            "train.draft_layers=2",
            "train.ttt_steps=5",
            "train.lr_schedule=linear",
            "train.held_out_fraction=0.1",
        ),
        "bench": ("bench.num_prompts=9",),
    }[workload]
    plan = resolve(example, PlanRequest(workload, "rtx6000", overrides=overrides, run_id="abc123"))
    settings = getattr(resolve_settings(example, overrides), workload)
    shared = set(type(plan.spec).model_fields) & set(type(settings).model_fields)
    for name in shared - DERIVED.get(workload, set()):
        assert getattr(plan.spec, name) == getattr(settings, name), name
    for override in overrides:
        name, value = override.split(".", 1)[1].split("=")
        assert str(getattr(plan.spec, name)) == value


def resolve_settings(example: LoadedProject, overrides: tuple[str, ...]) -> object:
    project = apply_overrides(example.project, "rtx6000", overrides)
    return project.clusters["rtx6000"].workloads


def test_every_exit_code_is_described_once_and_help_and_the_docs_render_that_list(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pathlib import Path

    from kimideploy.cli.main import main
    from kimideploy.errors import EXIT_CODE_MEANINGS, ExitCode, exit_codes_sentence
    from kimideploy.services.rendering import EXIT_CODE_PAGES, with_exit_code_table

    assert set(EXIT_CODE_MEANINGS) == set(ExitCode)
    root = Path(__file__).resolve().parents[2]
    for page in EXIT_CODE_PAGES:
        text = (root / page).read_text(encoding="utf-8")
        assert with_exit_code_table(text) == text, f"{page} is stale; run scripts/update-golden"
        for code, meaning in EXIT_CODE_MEANINGS.items():
            assert f"| {int(code)} | {meaning} |" in text
    assert main(["--help"]) == 0
    assert " ".join(exit_codes_sentence().split()) in " ".join(capsys.readouterr().out.split())
