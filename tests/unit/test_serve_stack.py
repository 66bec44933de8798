"""The serve stack's verdict reaches every place a drafter is judged, before any GPU hour."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kimideploy.config.loading import LoadedProject
from kimideploy.errors import UsageError
from kimideploy.plan.model import PlanRequest
from kimideploy.plan.resolve import resolve
from kimideploy.services.drafters.drafter_check import check
from kimideploy.services.release.deploy import refuse_failing_drafter
from tests.unit.test_methods import SERVE_016, serving_016

CANNOT = "speculation cannot pay on rtx6000's serve stack (vllm-0.16-kimi, vLLM 0.16.0 on sm_120)"


def test_drafter_check_fails_a_drafter_on_a_prefill_path_stack(example: LoadedProject) -> None:
    old = {f.name: f for f in check(serving_016(example).project, "v3", None, "rtx6000")}
    assert not old["serve stack"].ok and old["serve stack"].blocking
    assert CANNOT in old["serve stack"].detail and "PREFILL path" in old["serve stack"].detail
    new = {f.name: f for f in check(example.project, "v3", None, "rtx6000")}
    assert new["serve stack"].ok and "decode path" in new["serve stack"].detail
    method = {f.name: f for f in check(serving_016(example).project, "ngram", None, "rtx6000")}
    assert not method["serve stack"].ok  # a model-free method verifies the same way


def test_up_refuses_speculation_on_it_unless_forced(example: LoadedProject) -> None:
    plan = resolve(serving_016(example), PlanRequest("serve", "rtx6000", "v3"))
    assert "PREFILL path" in dict(plan.facts)["kernels"]
    with pytest.raises(UsageError, match="drafter v3 fails its check: serve stack"):
        refuse_failing_drafter(plan, force=False)
    refuse_failing_drafter(plan, force=True)
    plain = resolve(serving_016(example), PlanRequest("serve", "rtx6000", "none"))
    refuse_failing_drafter(plain, force=False)  # serving without speculation is fine there


@pytest.mark.parametrize("workload", ["train", "datagen"])
def test_training_for_it_warns_that_the_drafter_would_be_wasted(
    example: LoadedProject, workload: str
) -> None:
    plan = resolve(serving_016(example), PlanRequest(workload, "rtx6000"))
    assert any(w.startswith("a drafter trained for rtx6000 would be wasted") for w in plan.warnings)
    fine = resolve(example, PlanRequest(workload, "rtx6000"))
    assert not any("would be wasted" in w for w in fine.warnings)


def test_the_dry_run_refuses_what_up_refuses_with_the_same_exit(
    edited_config: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """A drafter predicted slower: `up --dry-run` exits 2 with `up`'s own message, after
    printing the plan; --force passes both."""
    from kimideploy.cli.main import main

    slow = edited_config(("  v3:\n", "  v3:\n    acceptance: [0.1, 0.05, 0.02]\n"))
    assert main(["--config", str(slow), "up", "serve", "--drafter", "v3", "--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert "predicted" in out and "error: drafter v3 fails its check: predicted speedup" in err
    assert "--force deploys it anyway" in err
    forced = ["--config", str(slow), "up", "serve", "--drafter", "v3", "--dry-run", "--force"]
    assert main(forced) == 0
    old = edited_config(SERVE_016)
    assert main(["--config", str(old), "up", "serve", "--drafter", "v3", "--dry-run"]) == 2
    assert "serve stack: speculation cannot pay" in capsys.readouterr().err


def test_render_kustomize_says_what_render_and_up_say(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """GitOps users get the judgement too: every cluster's warnings on stderr, by cluster."""
    from kimideploy.cli.main import main

    out = tmp_path / "tree"
    assert main(["render", "serve", "--drafter", "v2", "--kustomize", str(out)]) == 0
    err = capsys.readouterr().err
    for cluster in ("rtx6000", "b200", "b300"):
        assert f"warning: {cluster}: drafter v2 is marked rejected in the registry" in err


def test_the_dry_run_plan_document_carries_the_judgement(
    edited_config: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """`up --dry-run -o json`: one document a pipeline gates on, with the plan's predictions,
    warnings and findings, and `up`'s refusal with its exit code (2) when it would refuse."""
    import json

    from kimideploy.cli.main import main

    good = ["up", "serve", "--drafter", "v3", "--dry-run", "-o", "json"]
    assert main(good) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["status"] == "planned" and document["command"] == "up serve --dry-run"
    plan = document["plan"]
    assert plan["schema"] == "kimideploy.plan.v1" and plan["refusal"] is None
    assert plan["cluster"] == "rtx6000" and plan["release"] == document["release"]
    assert "predicted" in plan["facts"] and plan["objects"]
    # Beside the prose, the facts a script reads as values under the same labels.
    values = plan["values"]
    gpus = {
        "per_pod": 8,
        "product": "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition",
        "arch": "sm_120",
    }
    assert values["GPUs"] == gpus
    [serve] = values["memory"]
    assert serve["engine"] == "serve" and serve["tensor_parallel"] == 8
    assert isinstance(serve["kv_tokens"], int) and serve["kv_cache_gib"] > 0
    assert values["model runner"] == {"serve": "v2"}
    assert values["image"]["patches"] == ["0001-mla-eagle3-drafter-kimi-k2.patch",
                                          "0002-speculation-switch.patch"]  # fmt: skip
    assert set(values) <= set(plan["facts"])  # the same labels
    slow = edited_config(("  v3:\n", "  v3:\n    acceptance: [0.1, 0.05, 0.02]\n"))
    assert main(["--config", str(slow), *good]) == 2
    refused = json.loads(capsys.readouterr().out)
    assert refused["status"] == "refused" and refused["exit_code"] == 2
    assert refused["plan"]["refusal"]["exit_code"] == 2
    assert refused["plan"]["refusal"]["reason"] == refused["reason"]
    assert "fails its check: predicted speedup" in refused["reason"]
    assert any(f["status"] == "FAIL" for f in refused["plan"]["drafter_findings"])


def test_the_plan_shows_the_gate_flags_that_are_applied(capsys: pytest.CaptureFixture[str]) -> None:
    from kimideploy.cli.main import main

    args = ["up", "serve", "--drafter", "v3", "--dry-run", "--gate"]
    assert main([*args, "--min-speedup", "1.5", "--at-concurrency", "4"]) == 0
    out = capsys.readouterr().out
    assert "keep only at >= 1.50x output tokens/s over no drafter at c=4," in out
    assert main(args) == 0
    assert "keep only at >= 1.10x output tokens/s over no drafter at c=1,8," in (
        capsys.readouterr().out
    )


def test_render_and_drafter_check_refuse_what_up_refuses_with_the_same_exit(
    edited_config: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One judgement: for a drafter predicted slower, `up --dry-run`, `render`, `render
    --kustomize` and `drafter check` all exit 2 with `up`'s message; --force renders it."""
    from kimideploy.cli.main import main

    slow = str(edited_config(("  v3:\n", "  v3:\n    acceptance: [0.1, 0.05, 0.02]\n")))
    message = "drafter v3 fails its check: predicted speedup"
    commands = {
        "up": ["up", "serve", "--drafter", "v3", "--dry-run"],
        "render": ["render", "serve", "--drafter", "v3"],
        "kustomize": ["render", "serve", "--drafter", "v3", "--kustomize", str(tmp_path / "t")],
        "check": ["drafter", "check", "v3"],
    }
    for name, args in commands.items():
        assert main(["--config", slow, *args]) == 2, name
        err = capsys.readouterr().err
        assert message in err and "--force deploys it anyway" in err, (name, err)
        where = "error: overlay rtx6000: " if name == "kustomize" else "error: "
        assert f"\n{where}{message}" in f"\n{err}", err
    assert not (tmp_path / "t").exists()
    assert main(["--config", slow, "render", "serve", "--drafter", "v3", "--force"]) == 0
    assert "kind: Deployment" in capsys.readouterr().out


def test_render_o_is_a_format_and_dir_a_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from kimideploy.cli.main import main

    assert main(["render", "serve", "--drafter", "v3", "-o", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["kind"] == "List" and document["items"][-1]["kind"] == "Deployment"
    assert not (tmp_path / "json").exists()
    assert main(["render", "serve", "-o", "json", "--dir", str(tmp_path / "d")]) == 2
    assert "-o json prints to stdout" in capsys.readouterr().err
