"""Speculation methods besides Llama-layer EAGLE-3: n-gram, suffix and MLA EAGLE-3 drafters, each
typed with its own keys, rendered in vLLM's names, refused where the serve image cannot run it,
and checked by `drafter check` for what it needs."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kimideploy.cli.main import main
from kimideploy.config.drafters import Drafter, NgramMethod, SuffixMethod
from kimideploy.config.loading import LoadedProject, load_project
from kimideploy.errors import ConfigError, UsageError
from kimideploy.images.dockerfile import render_dockerfile
from kimideploy.images.selfcheck import SUFFIX_CHECK, checks_for
from kimideploy.plan.asks import ServeAsk
from kimideploy.plan.model import PlanRequest
from kimideploy.plan.resolve import resolve
from kimideploy.services.drafters.drafter_check import check
from kimideploy.services.drafters.listing import drafter_rows
from tests.unit.test_drafter_check import write_safetensors

NGRAM = "  ngram:\n    description: Prompt lookup"
SUFFIX_K = "    num_speculative_tokens: 24     # the longest draft"


def serving_016(example: LoadedProject) -> LoadedProject:
    """The example with the PCIe host back on the team's vLLM 0.16 stack."""
    clusters = dict(example.project.clusters)
    host = clusters["rtx6000"]
    images = host.images.model_copy(update={"serve": "vllm-0.16-kimi"})
    clusters["rtx6000"] = host.model_copy(update={"images": images})
    return replace(example, project=example.project.model_copy(update={"clusters": clusters}))


SERVE_016 = (
    "whatever the drafter.\n      serve: vllm-0.32-kimi\n",
    "whatever the drafter.\n      serve: vllm-0.16-kimi\n",
)


def issues_of(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_project(path)
    return list(info.value.issues)


def serve_args(example: LoadedProject, drafter: str, cluster: str) -> list[str]:
    plan = resolve(example, PlanRequest("serve", cluster, drafter))
    deployment = next(o.values for o in plan.objects if o.template == "deployment-serve")
    return list(deployment["args"])


def spec_config(example: LoadedProject, drafter: str, cluster: str) -> dict[str, Any]:
    args = serve_args(example, drafter, cluster)
    return dict(json.loads(args[args.index("--speculative-config") + 1]))


def init_containers(example: LoadedProject, drafter: str, cluster: str) -> dict[str, Any]:
    plan = resolve(example, PlanRequest("serve", cluster, drafter))
    deployment = next(o.values for o in plan.objects if o.template == "deployment-serve")
    return {c["name"]: c for c in deployment["init_containers"]}


def test_each_entry_is_typed_by_its_method(example: LoadedProject) -> None:
    drafters = example.project.drafters
    assert isinstance(drafters["ngram"], NgramMethod)
    assert isinstance(drafters["suffix"], SuffixMethod)
    assert isinstance(drafters["k25-mla"], Drafter) and drafters["k25-mla"].decoder == "mla"
    # Entries written before methods existed carry no `method` and stay EAGLE-3.
    assert isinstance(drafters["v3"], Drafter) and drafters["v3"].decoder == "llama"
    assert set(example.project.eagle_drafters) == {"k25", "k25-mla", "v1", "v2", "v3"}
    assert set(example.project.model_free_methods) == {"ngram", "suffix"}


def test_a_method_takes_only_its_own_keys(edited_config: Callable[..., Path]) -> None:
    path = edited_config(
        (NGRAM, "  ngram:\n    aux_layer_ids: [1]\n    description: Prompt lookup")
    )
    [issue] = issues_of(path)
    assert (
        "drafters.ngram.aux_layer_ids: unknown key (valid keys here: description, method, " in issue
    )
    assert "prompt_lookup_min, prompt_lookup_max" in issue and "max_tree_depth" not in issue


def test_method_bounds_and_windows_are_its_own(edited_config: Callable[..., Path]) -> None:
    [issue] = issues_of(edited_config((SUFFIX_K, SUFFIX_K.replace("24", "65"))))
    assert issue.endswith("drafters.suffix.num_speculative_tokens: must be between 1 and 64")
    [issue] = issues_of(edited_config(("    prompt_lookup_min: 2\n", "    prompt_lookup_min: 6\n")))
    assert "drafters.ngram: prompt_lookup_min (6) must not exceed prompt_lookup_max (5)" in issue


def test_an_unknown_method_is_named_with_the_valid_ones(edited_config: Callable[..., Path]) -> None:
    [issue] = issues_of(edited_config(("    method: ngram\n", "    method: medusa\n")))
    assert "drafters.ngram: method 'medusa' is not one kimideploy serves" in issue
    assert "'eagle3', 'ngram', 'suffix'" in issue


def test_training_a_model_free_method_is_a_config_error(
    edited_config: Callable[..., Path],
) -> None:
    text = (Path(__file__).parents[2] / "kimideploy.yaml").read_text()
    first = text.index("        drafter: v3\n        base_drafter: v1\n")
    edit = text[first - 40 : first] + "        drafter: v3\n"
    issues = issues_of(edited_config((edit, edit.replace("drafter: v3", "drafter: ngram"))))
    assert any(
        "workloads.train.drafter: 'ngram' is a model-free method (ngram): only an EAGLE-3 "
        "drafter is trained" in issue
        for issue in issues
    ), issues


def test_ngram_and_suffix_render_in_vllms_names(example: LoadedProject) -> None:
    assert spec_config(example, "ngram", "rtx6000") == {
        "method": "ngram", "num_speculative_tokens": 3,
        "prompt_lookup_min": 2, "prompt_lookup_max": 5,
    }  # fmt: skip
    assert spec_config(example, "suffix", "b200") == {
        "method": "suffix", "num_speculative_tokens": 24,
        "suffix_decoding_max_tree_depth": 24, "suffix_decoding_max_cached_requests": 10000,
        "suffix_decoding_max_spec_factor": 1.0, "suffix_decoding_min_token_prob": 0.1,
    }  # fmt: skip
    mla = spec_config(example, "k25-mla", "b200")
    assert mla["method"] == "eagle3" and "kimi-k2.5-eagle3-mla" in mla["model"]


def test_model_free_pods_pull_and_check_no_drafter_files(example: LoadedProject) -> None:
    ngram = init_containers(example, "ngram", "rtx6000")
    assert "drafter-check" not in ngram and "artifact-pull" not in ngram
    suffix = init_containers(example, "suffix", "b200")
    # Suffix decoding's one need, Arctic Inference, is proven in the pod before the load.
    command = suffix["drafter-check"]["command"]
    assert command == ["python", "-m", "kimideploy.images.selfcheck", SUFFIX_CHECK]
    mla = init_containers(example, "k25-mla", "b200")
    assert mla["drafter-check"]["command"][:4] == [
        "python",
        "-m",
        "kimideploy.workloads",
        "drafter-check",
    ]


@pytest.mark.parametrize(
    ("drafter", "message", "hint"),
    [
        ("suffix", "suffix decoding needs Arctic Inference and image vllm-0.16-kimi (serve on "
                   "rtx6000) has none", "clusters.rtx6000.images.serve: vllm-0.32-kimi"),
        ("k25-mla", "an MLA EAGLE-3 drafter needs vLLM >= 0.32 (Eagle3DeepseekV2ForCausalLM); "
                    "image vllm-0.16-kimi (serve on rtx6000) has vLLM 0.16.0", "images.serve: vllm-0.32-kimi"),
    ],
)  # fmt: skip
def test_a_method_the_serve_image_cannot_run_is_refused_before_anything_starts(
    example: LoadedProject, drafter: str, message: str, hint: str
) -> None:
    with pytest.raises(UsageError) as info:
        resolve(serving_016(example), PlanRequest("serve", "rtx6000", drafter))
    assert message in str(info.value) and hint in (info.value.hint or "")
    # The same request on the image that carries what it needs renders.
    on_032 = ServeAsk(image="vllm-0.32-kimi")
    resolve(serving_016(example), PlanRequest("serve", "rtx6000", drafter, ask=on_032))


def test_data_workloads_need_an_eagle3_drafter(example: LoadedProject) -> None:
    with pytest.raises(UsageError) as info:
        resolve(example, PlanRequest("extract", "b200", "suffix"))
    assert "extract builds data for an EAGLE-3 drafter" in str(info.value)


def test_drafter_list_shows_methods_with_their_settings(example: LoadedProject) -> None:
    rows = {r["name"]: r for r in drafter_rows(example.project)}
    assert (
        rows["ngram"]["source"] == "model-free (n-gram 2..5)" and rows["ngram"]["layer_ids"] is None
    )
    assert rows["suffix"]["tokens"] == 24 and rows["suffix"]["method"] == "suffix"
    assert rows["k25-mla"]["source"].endswith("(mla)")


def test_drafter_check_judges_a_model_free_method_by_its_serve_image(
    example: LoadedProject, edited_config: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    on_b200 = {f.name: f for f in check(example.project, "suffix", None, "b200")}
    assert on_b200["serve image"].ok and "Arctic Inference 0.3.0" in on_b200["serve image"].detail
    assert "known only once served" in on_b200["acceptance"].detail
    on_host = {f.name: f for f in check(serving_016(example).project, "suffix", None, "rtx6000")}
    assert not on_host["serve image"].ok and on_host["serve image"].blocking
    config = str(edited_config(SERVE_016))
    # The refusal `up` raises for the same findings, with its exit code.
    assert main(["--config", config, "drafter", "check", "suffix", "--cluster", "rtx6000"]) == 2
    assert "drafter suffix fails its check: serve stack" in capsys.readouterr().err
    assert main(["drafter", "check", "ngram", "--dir", "."]) == 2
    assert "ngram is a model-free method (ngram); it has no files" in capsys.readouterr().err


def test_measured_acceptance_of_a_method_predicts_its_speedup(
    edited_config: Callable[..., Path],
) -> None:
    path = edited_config(("    prompt_lookup_max: 5\n", "    prompt_lookup_max: 5\n"
                          "    acceptance: [0.2, 0.1, 0.05]\n"))  # fmt: skip
    found = {f.name: f for f in check(load_project(path).project, "ngram", None, "rtx6000")}
    assert "measured mean acceptance length" in found["acceptance"].detail
    assert not found["predicted speedup"].ok and found["predicted speedup"].blocking


def mla_dir(root: Path, **changes: Any) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["Eagle3DeepseekV2ForCausalLM"], "model_type": "kimi_k2",
              "hidden_size": 7168, "draft_vocab_size": 163840, "num_attention_heads": 64,
              "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
              "qk_rope_head_dim": 64, "v_head_dim": 128,
              "eagle_aux_hidden_state_layer_ids": [2, 30, 58], **changes}  # fmt: skip
    (root / "config.json").write_text(
        json.dumps({k: v for k, v in config.items() if v is not None})
    )
    write_safetensors(
        root / "model.safetensors",
        {"midlayer.self_attn.kv_a_proj_with_mqa.weight": ("BF16", [8, 8])},
    )
    return root


def mla_findings(example: LoadedProject, folder: Path, cluster: str = "b200") -> dict[str, Any]:
    return {f.name: f for f in check(example.project, "k25-mla", folder, cluster)}


def test_an_mla_drafter_passes_on_the_patched_032_image(
    example: LoadedProject, tmp_path: Path
) -> None:
    found = mla_findings(example, mla_dir(tmp_path / "mla"))
    assert found["architecture"].ok and found["attention shapes"].ok
    assert found["MLA detected"].ok, found["MLA detected"].detail
    assert "kv_lora_rank 512" in found["attention shapes"].detail


def test_mla_mistakes_are_caught_with_their_fix(example: LoadedProject, tmp_path: Path) -> None:
    no_rank = mla_findings(example, mla_dir(tmp_path / "a", kv_lora_rank=None))
    assert (
        not no_rank["attention shapes"].ok and "kv_lora_rank" in no_rank["attention shapes"].detail
    )
    llama = mla_findings(example, mla_dir(tmp_path / "b", architectures=["LlamaForCausalLMEagle3"]))
    assert not llama["architecture"].ok and "set decoder: llama" in llama["architecture"].fix
    on_016 = mla_findings(serving_016(example), mla_dir(tmp_path / "c"), cluster="rtx6000")
    assert (
        not on_016["architecture"].ok
        and "vLLM 0.16.0 has no MLA EAGLE-3 model" in on_016["architecture"].detail
    )


def test_kimi_k2_mla_detection_depends_on_the_images_patch(
    example: LoadedProject, tmp_path: Path
) -> None:
    """Without patch 0001, vLLM 0.32 runs a kimi_k2 MLA drafter's attention as ordinary attention
    (vllm-project/vllm#45764); a deepseek_v3 model_type needs no patch."""
    images = dict(example.project.images)
    images["vllm-0.32-kimi"] = images["vllm-0.32-kimi"].model_copy(update={"patches": []})
    unpatched = example.__class__(
        **{**example.__dict__, "project": example.project.model_copy(update={"images": images})}
    )
    found = {
        f.name: f for f in check(unpatched.project, "k25-mla", mla_dir(tmp_path / "a"), "b200")
    }
    assert (
        not found["MLA detected"].ok
        and "0001-mla-eagle3-drafter-kimi-k2.patch" in found["MLA detected"].fix
    )
    deepseek = mla_dir(tmp_path / "b", model_type="deepseek_v3")
    found = {f.name: f for f in check(unpatched.project, "k25-mla", deepseek, "b200")}
    assert found["MLA detected"].ok


def test_a_llama_record_names_an_mla_checkpoint(example: LoadedProject, tmp_path: Path) -> None:
    found = {f.name: f for f in check(example.project, "k25", mla_dir(tmp_path / "m"), "b200")}
    assert not found["architecture"].ok and "set decoder: mla" in found["architecture"].fix


def test_the_suffix_image_builds_arctic_inference_and_proves_it(example: LoadedProject) -> None:
    text = render_dockerfile(example.project, "vllm-0.32-kimi")
    assert "pip install --no-build-isolation --no-deps arctic-inference==0.3.0" in text
    assert 'io.kimideploy.arctic-inference.version="0.3.0"' in text
    assert (
        text.rstrip().count(SUFFIX_CHECK) == 1 and "0001-mla-eagle3-drafter-kimi-k2.patch" in text
    )
    assert (
        "arctic-inference"
        not in render_dockerfile(example.project, "vllm-0.16-kimi").split(
            "io.kimideploy.arctic-inference.version"
        )[0]
    )
    assert checks_for("0.32.0", [], suffix=True)[-1] == SUFFIX_CHECK
    assert SUFFIX_CHECK not in checks_for("0.32.0", [])
