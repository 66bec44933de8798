"""Config errors name the file, line and dotted path, say what is valid, and exit with code 2."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kimideploy.cli.main import main
from kimideploy.config.loading import load_project
from kimideploy.errors import ConfigError, ExitCode

V3_TOKENS = "num_speculative_tokens: 3\n    aux_layer_ids: [2, 30, 58]     # vLLM's"


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def issues_of(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_project(path)
    return info.value.issues


def test_out_of_range_names_file_line_path_and_bounds(edited_config: Callable[..., Path]) -> None:
    path = edited_config((V3_TOKENS, V3_TOKENS.replace("tokens: 3", "tokens: 17")))
    [issue] = issues_of(path)
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if "tokens: 17" in t)
    assert (
        issue
        == f"kimideploy.yaml:{line}: drafters.v3.num_speculative_tokens: must be between 1 and 16"
    )


def test_unknown_key_lists_valid_keys(edited_config: Callable[..., Path]) -> None:
    path = edited_config(
        ("  served_name: kimi-k2.5\n", "  served_name: kimi-k2.5\n  servd_name: x\n")
    )
    [issue] = issues_of(path)
    assert "model.servd_name: unknown key (valid keys here: repo, revision," in issue


def test_wrong_type(edited_config: Callable[..., Path]) -> None:
    path = edited_config(("  hidden_size: 7168\n", "  hidden_size: big\n"))
    [issue] = issues_of(path)
    assert "model.hidden_size:" in issue and "integer" in issue


def test_bad_quantity_is_caught_at_load(edited_config: Callable[..., Path]) -> None:
    path = edited_config(
        (
            'resources: {cpu: "48", memory: 384Gi}\n        startup',
            'resources: {cpu: "48", memory: lots}\n        startup',
        )
    )
    [issue] = issues_of(path)
    assert (
        "clusters.rtx6000.workloads.serve.resources.memory: 'lots' is not a Kubernetes quantity"
        in issue
    )


def test_unknown_image_reference_lists_valid_names(edited_config: Callable[..., Path]) -> None:
    anchor = "whatever the drafter.\n      serve: vllm-0.32-kimi\n"
    path = edited_config((anchor, anchor.replace("vllm-0.32-kimi", "vllm-0.17")))
    [issue] = issues_of(path)
    assert issue.endswith(
        "clusters.rtx6000.images.serve: unknown image 'vllm-0.17' "
        "(valid: tools, train-speculators-0.9, vllm-0.16-kimi, vllm-0.32-kimi)"
    )


def test_image_not_built_for_the_cluster_arch(edited_config: Callable[..., Path]) -> None:
    old = "built from source into the image\n    cuda_archs: [sm_100, sm_103, sm_120]"
    path = edited_config((old, old.replace(", sm_120]", "]")))
    issues = issues_of(path)
    assert any(
        "clusters.rtx6000.images.serve: image 'vllm-0.32-kimi' is built for sm_100, sm_103, not sm_120"
        in issue
        for issue in issues
    ), issues


def test_layer_id_out_of_range_in_its_convention(edited_config: Callable[..., Path]) -> None:
    old = "aux_layer_ids: [2, 30, 58]     # SpecForge"
    path = edited_config((old, old.replace("58]", "60]")))
    [issue] = issues_of(path)
    assert issue.endswith(
        "drafters.v1.aux_layer_ids[2]: 60 is out of range for a 61-layer target in the sglang "
        "convention (0..59)"
    )


def test_none_is_a_reserved_drafter_name(edited_config: Callable[..., Path]) -> None:
    path = edited_config(("\n  v3:\n", "\n  none:\n"))
    issues = issues_of(path)
    assert any("drafters: 'none' is reserved for non-speculative serving" in i for i in issues)


def test_every_problem_is_reported_at_once(edited_config: Callable[..., Path]) -> None:
    path = edited_config(
        ("  hidden_size: 7168\n", "  hidden_size: -1\n"),
        ("default_cluster: rtx6000", "default_cluster: rtx6000\nextra_top: 1"),
    )
    issues = issues_of(path)
    assert len(issues) == 2


def test_yaml_syntax_error_names_the_line(edited_config: Callable[..., Path]) -> None:
    path = edited_config(("  hidden_size: 7168\n", "  hidden_size: [7168\n"))
    with pytest.raises(ConfigError, match=r"kimideploy.yaml:\d+: invalid YAML"):
        load_project(path)


def test_rolling_update_that_cannot_fit_is_rejected(edited_config: Callable[..., Path]) -> None:
    path = edited_config(("    rollout: auto ", "    rollout: rolling "))
    [issue] = issues_of(path)
    assert "clusters.rtx6000.rollout: a rolling update needs room for 2 copies of 8 GPUs" in issue


def test_cli_reports_config_error_with_exit_code_2(
    edited_config: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = edited_config((V3_TOKENS, V3_TOKENS.replace("tokens: 3", "tokens: 0")))
    code, out, err = run_cli(capsys, "--config", str(path), "render", "serve")
    assert code == ExitCode.USAGE == 2
    assert out == ""
    assert "drafters.v3.num_speculative_tokens: must be between 1 and 16" in err
    assert "hint:" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("render", "serve", "--drafter", "v9"),
            "--drafter: unknown drafter 'v9' (valid: none, k25, k25-mla, ngram, suffix, v1, v2, v3)",
        ),
        (
            ("render", "serve", "--cluster", "h100"),
            "--cluster: unknown cluster 'h100' (valid: b200, b300, rtx6000)",
        ),
        (
            ("render", "train", "--set", "train.epochs=many"),
            "--set: clusters.rtx6000.workloads.train.epochs",
        ),
        (
            ("render", "train", "--set", "train.epoch=3"),
            "--set train.epoch=3: no setting 'train.epoch'",
        ),
        (
            ("render", "extract", "--drafter", "none"),
            "--drafter none: extract builds data for an EAGLE-3 drafter",
        ),
    ],
)
def test_bad_arguments_exit_2(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str
) -> None:
    code, _, err = run_cli(capsys, *args)
    assert code == 2
    assert message in err


def test_missing_config_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "--config", str(tmp_path / "nope.yaml"), "render", "serve")
    assert code == 2
    assert "cannot read the project file" in err


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("../outside", "'../outside' must be a plain relative folder (no '.', '..' or //)"),
        ("drafters/./v3", "must be a plain relative folder"),
        ("hub/moonshotai/Kimi-K2.5", "is inside the model tree (hub/), which training would move"),
        ("drafters/v2", "overlaps the folder of drafter v2 (drafters/v2)"),
        (
            "drafters/AQ-MedAI/Kimi-K2-Instruct-eagle3",
            "overlaps the folder of hub drafter v1 (drafters/AQ-MedAI/Kimi-K2-Instruct-eagle3/",
        ),
    ],
)
def test_a_drafter_path_that_escapes_or_collides_is_refused(
    edited_config: Callable[..., Path], path: str, message: str
) -> None:
    """Training moves an existing drafter folder aside: it must never be the model, another
    drafter, or outside the models volume."""
    config = edited_config(("    source: {path: drafters/v3}", f"    source: {{path: {path}}}"))
    issues = issues_of(config)
    assert any("drafters.v3.source.path" in i and message in i for i in issues), issues


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("    namespace: kimi\n    kubernetes_version: \"1.33\"", "    namespace: kimi.prod\n    kubernetes_version: \"1.33\""),
         "clusters.rtx6000.namespace: 'kimi.prod' is not a valid Kubernetes namespace name"),
        (("        startup_budget_s: 2700 ", '        pod_annotations: {"bad key!": "x"}\n        startup_budget_s: 2700 '),
         "pod_annotations.bad key!: 'bad key!' is not a valid Kubernetes label or annotation key"),
        (("hf_token: {name: hf-token, key: token}", "hf_token: {name: Hf_Token, key: token}"),
         "model.hf_token.name: 'Hf_Token' is not a valid Kubernetes object name"),
        (("    model_variant: nvfp4 ", "    node_selector: {pool: \"gpu nodes\"}\n    model_variant: nvfp4 "),
         "clusters.b200.node_selector.pool: 'gpu nodes' is not a valid Kubernetes label value"),
    ],
)  # fmt: skip
def test_names_the_api_server_would_reject_are_config_errors(
    edited_config: Callable[..., Path], edit: tuple[str, str], message: str
) -> None:
    """Found at load time with the file's path, not by the API server half-way through an apply."""
    issues = issues_of(edited_config(edit))
    assert any(message in issue for issue in issues), issues


def test_a_bench_prompt_set_must_be_built_in_or_a_named_file(
    edited_config: Callable[..., Path],
) -> None:
    old = "        concurrency: [1, 4, 8, 32]\n"
    path = edited_config((old, old + "        prompt_sets: [chat, mine]\n"))
    with pytest.raises(ConfigError, match=r"prompt_sets \['mine'\] are neither built in"):
        load_project(path)
    named = edited_config(
        (
            old,
            old
            + "        prompt_sets: [chat, mine]\n        prompt_files: {mine: prompts/mine.jsonl}\n",
        )
    )
    assert load_project(named).project.clusters["rtx6000"].workloads.bench.prompt_files == {
        "mine": "prompts/mine.jsonl"
    }
