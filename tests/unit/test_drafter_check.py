"""`drafter check` on crafted drafter folders: each problem is caught and says its fix."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kimideploy.cli.main import main
from kimideploy.config.loading import LoadedProject, load_project
from kimideploy.plan.model import PlanRequest
from kimideploy.plan.resolve import resolve
from kimideploy.services.drafters.drafter_check import check
from tests.conftest import REPO

SIZES = {"I64": 8, "BOOL": 1, "BF16": 2}


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    header: dict[str, Any] = {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        count = 1
        for dim in shape:
            count *= dim
        header[name] = {
            "dtype": dtype,
            "shape": shape,
            "data_offsets": [offset, offset + count * SIZES[dtype]],
        }
        offset += count * SIZES[dtype]
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


def drafter_dir(root: Path, **config_changes: Any) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 7168, "draft_vocab_size": 32000,
              "eagle_aux_hidden_state_layer_ids": [2, 30, 58], **config_changes}  # fmt: skip
    (root / "config.json").write_text(
        json.dumps({k: v for k, v in config.items() if v is not None})
    )
    write_safetensors(root / "model.safetensors", {"layers.0.self_attn.q_proj.weight": ("BF16", [8, 8]),
                                                   "d2t": ("I64", [32000]), "t2d": ("BOOL", [163840])})  # fmt: skip
    return root


def findings(example: LoadedProject, name: str, folder: Path | None) -> dict[str, Any]:
    return {f.name: f for f in check(example.project, name, folder)}


def write_lineage(folder: Path, example: LoadedProject, **changes: Any) -> Path:
    model = example.project.model
    lineage = {"kind": "kimideploy.drafter-lineage.v1", "run_id": "abc123", "trained_for": model.repo,
               "trained_for_revision": model.revision, "eagle_aux_hidden_state_layer_ids": [2, 30, 58],
               "metrics": {"accuracy_per_position": [0.7, 0.6, 0.5]},
               "held_out": {"depth": 3, "samples": 500, "mean_acceptance_length": {"1": 1.7, "2": 2.2, "3": 2.5}},
               "selected_checkpoint": {"step": 900, "reason": "the last step has the best held-out mean acceptance length at k=3 (2.5)"},
               **changes}  # fmt: skip
    (folder / "kimideploy-lineage.json").write_text(json.dumps(lineage))
    return folder


def test_a_good_v3_passes(example: LoadedProject, tmp_path: Path) -> None:
    found = findings(example, "v3", write_lineage(drafter_dir(tmp_path / "v3"), example))
    assert [name for name, f in found.items() if not f.ok] == []


def test_a_speculators_format_drafter_is_understood(example: LoadedProject, tmp_path: Path) -> None:
    """What `kimideploy run train` writes: speculators 0.9's config with the layer config nested."""
    folder = drafter_dir(tmp_path / "v3", architectures=["Eagle3DraftModel"], hidden_size=None,
                         speculators_model_type="eagle3", transformer_layer_config={"hidden_size": 7168},
                         speculators_config={"proposal_methods": [{"speculative_tokens": 5}]})  # fmt: skip
    found = findings(example, "v3", write_lineage(folder, example))
    assert found["architecture"].ok and found["hidden size"].ok
    tokens = found["trained tokens"]
    assert not tokens.ok and not tokens.blocking
    assert tokens.detail == "trained for 5 speculative tokens, registry serves 3"


def test_the_lineage_file_catches_a_drafter_trained_for_another_target(
    example: LoadedProject, tmp_path: Path
) -> None:
    folder = write_lineage(drafter_dir(tmp_path / "v3"), example, trained_for_revision="f" * 40,
                           eagle_aux_hidden_state_layer_ids=[2, 30, 58])  # fmt: skip
    found = findings(example, "v3", folder)
    target = found["lineage: target"]
    assert (
        not target.ok
        and target.blocking
        and "trained on moonshotai/Kimi-K2.5@ffffffffffff" in target.detail
    )
    (folder / "kimideploy-lineage.json").unlink()
    missing = findings(example, "v3", folder)["lineage file"]
    assert not missing.ok and not missing.blocking


def test_the_teams_layer_id_trap_is_caught_with_the_fix(
    example: LoadedProject, tmp_path: Path
) -> None:
    # v2: trained with speculators 0.4 (layer outputs = sglang convention) and no ids in config.json
    found = findings(
        example, "v2", drafter_dir(tmp_path / "v2", eagle_aux_hidden_state_layer_ids=None)
    )
    layer = found["layer ids"]
    assert not layer.ok and layer.blocking
    assert "no eagle_aux_hidden_state_layer_ids: vLLM uses its default [2, 30, 58]" in layer.detail
    assert "record: [2, 30, 58] in the sglang convention = [3, 31, 59] in vLLM's" in layer.detail
    assert (
        layer.fix
        == 'set "eagle_aux_hidden_state_layer_ids": [3, 31, 59] at the top level of config.json'
    )


def test_lineage_and_too_many_tokens_are_reported(example: LoadedProject) -> None:
    v1, v2 = findings(example, "v1", None), findings(example, "v2", None)
    assert (
        not v1["trained for this target"].ok
        and "moonshotai/Kimi-K2-Instruct" in v1["trained for this target"].detail
    )
    assert not v2["speculative tokens"].ok and "3" in v2["speculative tokens"].fix


@pytest.mark.parametrize(
    ("changes", "check_name", "expected"),
    [
        ({"architectures": ["LlamaForCausalLM"]}, "architecture", "LlamaForCausalLM"),
        ({"hidden_size": 4096}, "hidden size", "4096 (target 7168)"),
        ({"draft_vocab_size": 16000}, "draft vocab size", "config.json 16000, registry 32000"),
        (
            {"eagle_aux_hidden_state_layer_ids": [1, 29, 57]},
            "layer ids",
            "config.json says [1, 29, 57]",
        ),
    ],
)
def test_each_problem_is_caught(
    example: LoadedProject, tmp_path: Path, changes: dict[str, Any], check_name: str, expected: str
) -> None:
    found = findings(example, "v3", drafter_dir(tmp_path / "d", **changes))
    assert (
        not found[check_name].ok and expected in found[check_name].detail and found[check_name].fix
    )


def test_map_shapes_and_truncated_weights(example: LoadedProject, tmp_path: Path) -> None:
    folder = drafter_dir(tmp_path / "d")
    write_safetensors(
        folder / "model.safetensors", {"d2t": ("I64", [100]), "t2d": ("BOOL", [1000])}
    )
    assert (
        "d2t [100], t2d [1000] (want [32000] and [163840])"
        in findings(example, "v3", folder)["vocab maps"].detail
    )
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    assert not findings(example, "v3", folder)["weights readable"].ok


def test_measured_acceptance_predicts_a_slowdown(edited_config: Callable[..., Path]) -> None:
    old = "    num_speculative_tokens: 5      # what was served"
    path = edited_config((old, "    acceptance: [0.2, 0.1, 0.05, 0.03, 0.02]\n" + old))
    found = {f.name: f for f in check(load_project(path).project, "v2", None)}
    assert (
        not found["predicted speedup"].ok
        and "SLOWER than no speculation" in found["predicted speedup"].detail
    )
    assert found["speculative tokens"].fix == "set num_speculative_tokens to 1"


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["drafter", "check", "v3", "--dir", str(drafter_dir(tmp_path / "ok"))]) == 0
    code = main(
        [
            "drafter",
            "check",
            "v2",
            "--dir",
            str(drafter_dir(tmp_path / "bad", eagle_aux_hidden_state_layer_ids=None)),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 2 and "drafter v2 fails its check: " in err and "[3, 31, 59]" in out
    assert main(["drafter", "check", "v9"]) == 2


def test_up_refuses_a_drafter_predicted_to_be_slower(edited_config: Callable[..., Path]) -> None:
    from kimideploy.errors import UsageError
    from kimideploy.services.release.deploy import refuse_failing_drafter

    old = "    num_speculative_tokens: 5      # what was served"
    loaded = load_project(
        edited_config((old, "    acceptance: [0.2, 0.1, 0.05, 0.03, 0.02]\n" + old))
    )
    with pytest.raises(UsageError, match="drafter v2 fails its check: predicted speedup"):
        refuse_failing_drafter(resolve(loaded, PlanRequest("serve", None, "v2")), force=False)
    refuse_failing_drafter(resolve(loaded, PlanRequest("serve", None, "v2")), force=True)
    refuse_failing_drafter(resolve(loaded, PlanRequest("serve", None, "none")), force=False)


def test_the_serve_pods_init_container_checks_the_copy_on_the_models_volume(
    example: LoadedProject, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`python -m kimideploy.workloads drafter-check` with the serve spec the renderer wrote."""
    from kimideploy.config.specs import ServeSpec
    from kimideploy.plan.model import PlanRequest
    from kimideploy.services.rendering import render_workload
    from kimideploy.workloads import drafter_check

    rendered = render_workload(example, PlanRequest("serve", "b300", "v2"))
    deployment = next(o for o in rendered.objects if o["kind"] == "Deployment")
    [init] = [
        c
        for c in deployment["spec"]["template"]["spec"]["initContainers"]
        if c["name"] == "drafter-check"
    ]
    assert init["command"] == [
        "python",
        "-m",
        "kimideploy.workloads",
        "drafter-check",
        "--spec",
        "/etc/kimideploy/spec.json",
    ]
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in init["volumeMounts"]
    config_map = next(o for o in rendered.objects if o["kind"] == "ConfigMap")
    spec = ServeSpec.model_validate_json(config_map["data"]["spec.json"])
    assert spec.draft_vocab_size == 32000 and spec.drafter_path == "/models/drafters/v2"
    # The team's trap: v2 was written in the sglang convention with no ids in config.json.
    copy = drafter_dir(tmp_path / "v2", eagle_aux_hidden_state_layer_ids=None)
    assert drafter_check.run(spec.model_copy(update={"drafter_path": str(copy)})) == 2
    err = capsys.readouterr().err
    assert "FAIL layer ids: config.json has no eagle_aux_hidden_state_layer_ids" in err
    assert 'fix: set "eagle_aux_hidden_state_layer_ids": [3, 31, 59]' in err
    assert "not starting a model load that would fail" in err
    fixed = drafter_dir(tmp_path / "v2-fixed", eagle_aux_hidden_state_layer_ids=[3, 31, 59])
    assert drafter_check.run(spec.model_copy(update={"drafter_path": str(fixed)})) == 0
    none = render_workload(example, PlanRequest("serve", "b300", "none")).objects
    pod = next(o for o in none if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert "drafter-check" not in [c["name"] for c in pod["initContainers"]]


def test_the_k25_native_drafter_passes_its_check_with_its_full_vocabulary(
    example: LoadedProject, tmp_path: Path
) -> None:
    """lightseekorg/kimi-k2.5-eagle3 as the registry records it: vLLM-convention ids in its
    config.json, the target's full 163840-token vocabulary (no d2t/t2d maps)."""
    record = example.project.drafters["k25"]
    assert (
        record.source.hub is not None and record.source.hub.repo == "lightseekorg/kimi-k2.5-eagle3"
    )
    assert record.lineage.trained_for == example.project.model.repo
    folder = tmp_path / "k25"
    folder.mkdir()
    config = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 7168,
              "draft_vocab_size": record.draft_vocab_size,
              "eagle_aux_hidden_state_layer_ids": list(record.aux_layer_ids)}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    write_safetensors(
        folder / "model.safetensors", {"layers.0.self_attn.q_proj.weight": ("BF16", [8, 8])}
    )
    found = {f.name: f for f in check(example.project, "k25", folder, cluster="rtx6000")}
    # A published drafter carries no kimideploy lineage file: a warning, its record's lineage stands.
    assert [name for name, f in found.items() if not f.ok] == ["lineage file"]
    assert "no maps needed" in found["vocab maps"].detail
    shifted = {**config, "eagle_aux_hidden_state_layer_ids": [a - 1 for a in record.aux_layer_ids]}
    (folder / "config.json").write_text(json.dumps(shifted))
    failed = [f for f in check(example.project, "k25", folder, cluster="rtx6000") if not f.ok]
    assert failed and failed[0].blocking


def test_serving_a_drafter_on_another_checkpoint_is_a_warning_with_its_fix(
    example: LoadedProject,
) -> None:
    project = example.project
    assert project.clusters["b200"].model_variant == "nvfp4"
    assert project.model_for("b200").repo == "nvidia/Kimi-K2.5-NVFP4"
    assert project.model_for("rtx6000") == project.model
    on_b200 = {f.name: f for f in check(project, "k25", None, cluster="b200")}
    variant = on_b200["model variant"]
    assert not variant.ok and not variant.blocking
    assert "trained on the default checkpoint (moonshotai/Kimi-K2.5)" in variant.detail
    assert "cluster b200 serves variant nvfp4 (nvidia/Kimi-K2.5-NVFP4)" in variant.detail
    assert on_b200["trained for this target"].ok  # a variant is the same model
    on_rtx = {f.name: f for f in check(project, "k25", None, cluster="rtx6000")}
    assert on_rtx["model variant"].ok


def test_a_published_prior_predicts_until_acceptance_is_measured(example: LoadedProject) -> None:
    from kimideploy.plan.model import PlanRequest
    from kimideploy.plan.resolve import resolve
    from kimideploy.services.drafters.listing import drafter_rows

    rows = {r["name"]: r for r in drafter_rows(example.project)}
    assert rows["k25"]["prior_length"] == "2.69-3.34 @k=3 (published)"
    assert rows["k25"]["measured_length"] is None
    assert rows["v1"]["prior_length"] is None
    plan = resolve(example, PlanRequest("serve", "rtx6000", "k25"))
    predicted = dict(plan.facts)["predicted"]
    assert "prior: published mean acceptance length 3.13" in predicted and "x (k=3" in predicted
    warnings = " ".join(resolve(example, PlanRequest("serve", "b200", "k25")).warnings)
    assert "cluster b200 serves variant nvfp4" in warnings


V3_STATUS = "    status: candidate              # EXAMPLE"


def held_out_config(edited_config: Callable[..., Path], lengths: str, extra: str = "") -> Path:
    """v3 with a training run's held-out judgement in the registry (what `drafter publish` or a
    user copies from kimideploy-lineage.json)."""
    record = (f"    held_out: {{mean_acceptance_length: {lengths}, samples: 240, step: 600, "
              f"run: abc123}}\n{extra}")  # fmt: skip
    return edited_config(("  v3:\n", "  v3:\n" + record))


def test_held_out_acceptance_predicts_ahead_of_a_prior_and_behind_serving(
    edited_config: Callable[..., Path],
) -> None:
    from kimideploy.services.drafters.listing import drafter_rows

    prior = "    published: {mean_acceptance_length: {mt-bench: 3.3}, num_speculative_tokens: 3, source: card}\n"
    loaded = load_project(held_out_config(edited_config, "{1: 1.7, 2: 2.2, 3: 2.5}", prior))
    plan = resolve(loaded, PlanRequest("serve", "rtx6000", "v3"))
    predicted = dict(plan.facts)["predicted"]
    assert (
        "held-out mean acceptance length 2.50 (training run abc123, 240 samples never trained on, step 600)"
        in predicted
    )
    assert "c=1 1.77x" in predicted  # 2.5 / 1.41
    row = {r["name"]: r for r in drafter_rows(loaded.project)}["v3"]
    assert row["held_out_length"] == "2.50 @k=3 (held-out, run abc123)"
    shown = {f.name: f for f in check(loaded.project, "v3", None)}["acceptance"].detail
    assert shown.index("held-out mean acceptance length 2.50") < shown.index(
        "prior: published mean acceptance length 3.30"
    )
    # What serving measured wins over both.
    measured = load_project(
        held_out_config(edited_config, "{3: 2.5}", prior + "    acceptance: [0.3, 0.2, 0.1]\n")
    )
    assert (
        "measured mean acceptance length"
        in dict(resolve(measured, PlanRequest("serve", "rtx6000", "v3")).facts)["predicted"]
    )


def test_up_refuses_a_drafter_whose_held_out_length_is_below_break_even(
    edited_config: Callable[..., Path],
) -> None:
    from kimideploy.errors import UsageError
    from kimideploy.services.release.deploy import refuse_failing_drafter

    loaded = load_project(held_out_config(edited_config, "{1: 1.1, 2: 1.2, 3: 1.31}"))
    found = {f.name: f for f in check(loaded.project, "v3", None)}["predicted speedup"]
    assert not found.ok and found.blocking
    assert "held-out mean acceptance length 1.31 at k=3, break-even 1.41" in found.detail
    assert "0.93x (SLOWER than no speculation) at c=1" in found.detail
    with pytest.raises(UsageError, match="drafter v3 fails its check: predicted speedup"):
        refuse_failing_drafter(resolve(loaded, PlanRequest("serve", None, "v3")), force=False)
    refuse_failing_drafter(resolve(loaded, PlanRequest("serve", None, "v3")), force=True)
    # A published prior below break-even warns but does not block: it was measured elsewhere.
    prior = load_project(
        edited_config(
            (
                "  v3:\n",
                "  v3:\n    published: {mean_acceptance_length: {x: 1.2}, num_speculative_tokens: 3, source: card}\n",
            )
        )
    )
    assert not {f.name: f for f in check(prior.project, "v3", None)}["predicted speedup"].blocking


def test_drafter_check_reads_the_held_out_judgement_from_the_lineage_file(
    example: LoadedProject, tmp_path: Path
) -> None:
    folder = write_lineage(drafter_dir(tmp_path / "d"), example, held_out={
        "depth": 3, "samples": 64, "by_k": {"3": {"acceptance_per_position": [0.5, 0.4, 0.3]}},
        "mean_acceptance_length": {"1": 1.5, "2": 1.7, "3": 1.8}},
        selected_checkpoint={"step": 40, "reason": "step 40 has the best held-out mean acceptance length at k=3 (1.8)"})  # fmt: skip
    found = findings(example, "v3", folder)
    assert found["lineage: held-out"].ok
    assert (
        "k=1 1.5, k=2 1.7, k=3 1.8 on 64 samples never trained on"
        in found["lineage: held-out"].detail
    )
    assert "step 40 has the best" in found["lineage: held-out"].detail
    # The registry has none for v3: the lineage file's figure predicts, labelled held-out.
    assert "held-out mean acceptance length 1.80" in found["acceptance"].detail
    assert found["predicted speedup"].ok and "1.27x" in found["predicted speedup"].detail
    older = write_lineage(drafter_dir(tmp_path / "old"), example, held_out=None)
    assert not findings(example, "v3", older)["lineage: held-out"].ok
    (older / "kimideploy-lineage.json").write_text("{not json")
    broken = findings(example, "v3", older)["lineage file"]
    assert not broken.ok and "not valid JSON" in broken.detail


def interval_config(
    edited_config: Callable[..., Path], length: float, low: float, high: float
) -> Path:
    """v3 with held-out figures and their interval, as `drafter publish` pins them."""
    record = (f"    held_out: {{mean_acceptance_length: {{3: {length}}}, samples: 64, step: 400, "
              f"run: abc123, turns: 39, ci95: {{3: [{low}, {high}]}}, "
              f"stands_for: held-out conversations of the training data}}\n")  # fmt: skip
    return edited_config(("  v3:\n", "  v3:\n" + record))


@pytest.mark.parametrize(
    ("length", "low", "high", "ok", "blocking", "words"),
    [
        (1.30, 1.25, 1.36, False, True, "below break-even however the held-out turns are sampled"),
        (1.50, 1.38, 1.62, False, False, "it may not pay"),  # straddles 1.41: a warning
        (1.80, 1.60, 2.00, True, False, "its 95% interval 1.60-2.00 at k=3 against break-even 1.41"),
    ],
)  # fmt: skip
def test_up_refuses_by_the_held_out_interval_and_warns_when_it_straddles_break_even(
    edited_config: Callable[..., Path], length: float, low: float, high: float, ok: bool,
    blocking: bool, words: str,
) -> None:  # fmt: skip
    from kimideploy.errors import UsageError
    from kimideploy.services.drafters.listing import drafter_rows
    from kimideploy.services.release.deploy import refuse_failing_drafter

    loaded = load_project(interval_config(edited_config, length, low, high))
    found = {f.name: f for f in check(loaded.project, "v3", None)}["predicted speedup"]
    assert (found.ok, found.blocking) == (ok, blocking), found
    assert words in found.detail
    shown = {f.name: f for f in check(loaded.project, "v3", None)}["acceptance"].detail
    assert f"held-out mean acceptance length {length:.2f}, 95% {low:.2f}-{high:.2f}" in shown
    assert "39 turns" in shown
    row = {r["name"]: r for r in drafter_rows(loaded.project)}["v3"]
    assert (
        row["held_out_length"]
        == f"{length:.2f} [95% {low:.2f}-{high:.2f}, 39 turns] @k=3 (held-out, run abc123)"
    )
    plan = resolve(loaded, PlanRequest("serve", "rtx6000", "v3"))
    assert f"95% {low:.2f}-{high:.2f}" in dict(plan.facts)["predicted"]  # up --dry-run shows it
    if blocking:
        with pytest.raises(UsageError, match="drafter v3 fails its check: predicted speedup"):
            refuse_failing_drafter(plan, force=False)
    else:
        refuse_failing_drafter(plan, force=False)
        assert any("it may not pay" in w for w in plan.warnings) == (not ok)


def test_an_interval_that_does_not_hold_its_figure_is_a_config_error(
    edited_config: Callable[..., Path],
) -> None:
    from kimideploy.errors import ConfigError

    with pytest.raises(ConfigError, match=r"ci95\[3\] = \[1.9, 2.0\] does not hold its figure 1.8"):
        load_project(interval_config(edited_config, 1.8, 1.9, 2.0))


def test_the_readmes_promises_hold(
    example: LoadedProject,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    edited_config: Callable[..., Path],
) -> None:
    """README's first paragraphs say which of the team's mistakes are refused and which warn."""
    readme = " ".join((REPO / "README.md").read_text().split())
    assert (
        "a drafter trained for another model and layer ids in the wrong convention are refused; "
        "too many speculative tokens are refused where the step-cost model predicts them slower "
        "than no speculation, and a warning otherwise" in readme
    )
    other = write_lineage(drafter_dir(tmp_path / "other"), example, trained_for_revision="f" * 40)
    assert main(["drafter", "check", "v3", "--dir", str(other)]) == 2
    wrong = drafter_dir(tmp_path / "wrong", eagle_aux_hidden_state_layer_ids=None)
    assert main(["drafter", "check", "v2", "--dir", str(wrong)]) == 2
    capsys.readouterr()
    # Trained for 5 tokens, served at 3: a warning, exit 0.
    more = drafter_dir(tmp_path / "more", architectures=["Eagle3DraftModel"], hidden_size=None,
                       speculators_model_type="eagle3",
                       transformer_layer_config={"hidden_size": 7168},
                       speculators_config={"proposal_methods": [{"speculative_tokens": 5}]})  # fmt: skip
    assert main(["drafter", "check", "v3", "--dir", str(write_lineage(more, example))]) == 0
    assert "trained for 5 speculative tokens, registry serves 3" in capsys.readouterr().out
    # Predicted slower than none at its k: refused.
    old = "    num_speculative_tokens: 5      # what was served"
    slower = edited_config((old, "    acceptance: [0.2, 0.1, 0.05, 0.03, 0.02]\n" + old))
    assert main(["--config", str(slower), "up", "serve", "--drafter", "v2", "--dry-run"]) == 2
    assert "predicted speedup" in capsys.readouterr().err


def test_eagle31_norms_are_refused_where_the_engine_would_drop_them(
    example: LoadedProject, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """kimi-k2.6-eagle3.1-mla's flags: vLLM 0.32 reads fc_norm, norm_before_fc and norm_output;
    0.16 reads none. A flag without its weights (or weights without their flag) loads without an
    error in 0.32 and serves a drafter missing a norm it was trained with."""
    from kimideploy.config.specs import ServeSpec
    from kimideploy.services.rendering import render_workload
    from kimideploy.workloads import drafter_check

    rendered = render_workload(example, PlanRequest("serve", "b300", "v3"))
    config_map = next(o for o in rendered.objects if o["kind"] == "ConfigMap")
    spec = ServeSpec.model_validate_json(config_map["data"]["spec.json"])
    folder = drafter_dir(tmp_path / "v31", fc_norm=True, norm_output=True)
    tensors = {"layers.0.self_attn.q_proj.weight": ("BF16", [8, 8]), "d2t": ("I64", [32000]),
               "t2d": ("BOOL", [163840]), **{f"fc_norm.{i}.weight": ("BF16", [7168]) for i in range(3)}}  # fmt: skip
    write_safetensors(folder / "model.safetensors", tensors)
    write_lineage(folder, example)

    def norms(version: str) -> tuple[int, str]:
        served = spec.model_copy(update={"drafter_path": str(folder), "vllm_version": version})
        code = drafter_check.run(served)
        line = next(
            line for line in capsys.readouterr().err.splitlines() if "EAGLE-3.1 norms" in line
        )
        return code, line

    code, line = norms("0.32.0")
    assert code == 0 and line.endswith("pass EAGLE-3.1 norms: fc_norm, norm_output (vLLM 0.32.0)")
    code, line = norms("0.16.0")
    assert code == 2 and "vLLM 0.16.0 reads none of fc_norm, norm_before_fc, norm_output" in line
    assert "fix: serve it with an image whose vLLM is >= 0.32" in line
    # Norms dropped from the config but present in the weights; a flag with no weights.
    (folder / "config.json").write_text(
        json.dumps({**json.loads((folder / "config.json").read_text()), "fc_norm": False,
                    "eagle_config": {"norm_before_fc": True}})
    )  # fmt: skip
    code, line = norms("0.32.0")
    assert code == 2
    assert (
        "fc_norm off but 3 fc_norm.* tensors; norm_before_fc on but no input_norm.* tensor" in line
    )
    # A plain EAGLE-3 drafter has no such finding at all.
    plain = write_lineage(drafter_dir(tmp_path / "v3"), example)
    assert "EAGLE-3.1 norms" not in findings(example, "v3", plain)
