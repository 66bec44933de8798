"""The promotion gate on the real control plane, with bench results delivered as a real bench job
delivers them: the `result` line in its pod's log, served by KWOK for the simulated pod."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kimideploy.config.loading import load_project
from tests import observability
from tests.conftest import REPO
from tests.integration.conftest import harness, served_pod_monitor_crd

pytestmark = pytest.mark.integration
FAST = ("--yes", "--poll", "0.2", "--scheduling-grace", "2")
BENCH_PODS = "app.kubernetes.io/component=bench"
LEVELS = (1, 8)
QUICK_BENCH = "bench.pod_annotations=" + json.dumps(
    {"kimideploy.test/run-duration": "1s", "kimideploy.test/await-hook": "true"}
)
"""Bench pods that run 1 s once a harness.PodHooks has given them their log (use it inside one)."""
MANUAL_BENCH = ("--set", QUICK_BENCH, "--set", "bench.concurrency=[1, 8]", "--poll", "0.3")


def bench_level(
    prompt_set: str, concurrency: int, tokens_per_s: float, rate: float | None
) -> dict[str, Any]:
    return {
        "prompt_set": prompt_set,
        "concurrency": concurrency,
        "requests": 50,
        "failed": 0,
        "output_tokens": 51200,
        "seconds": round(51200 / tokens_per_s, 3),
        "output_tokens_per_s": tokens_per_s,
        "ttft_p50_s": 0.21,
        "ttft_p99_s": 0.9,
        "tpot_p50_s": round(concurrency / tokens_per_s, 5),
        "tpot_p99_s": round(2 * concurrency / tokens_per_s, 5),
        "metrics": "scraped",
        "acceptance_rate": rate,
        "mean_acceptance_length": None if rate is None else 1 + 3 * rate,
        "per_position_acceptance": None if rate is None else [rate + 0.2, rate, rate - 0.2],
        "errors": [],
    }


def bench_log(path: Path, drafter: str, tokens_per_s: dict[int, float], rate: float | None) -> Path:
    """What the bench workload prints: human lines on stderr, progress and result on stdout."""
    levels = [
        bench_level(p, c, tokens_per_s[c], rate) for p in ("chat", "reasoning") for c in LEVELS
    ]
    result = {
        "event": "result",
        "stage": "bench",
        "run_id": "x",
        "drafter": drafter,
        "levels": levels,
    }
    progress = {
        "event": "progress",
        "stage": "bench",
        "done": 4,
        "total": 4,
        "unit": "levels",
        "rate": 0.0,
    }
    return harness.write_container_log(
        path, [json.dumps(progress), "chat c=1 ... (human line)", json.dumps(result)]
    )


def baseline_and_v3(where: Path, v3_tokens_per_s: dict[int, float], rate: float) -> dict[str, Path]:
    """Bench logs of the non-speculative baseline (60 and 400 tok/s at c=1 and 8) and of v3."""
    return {
        "none": bench_log(where / "none.log", "none", {1: 60.0, 8: 400.0}, None),
        "v3": bench_log(where / "v3.log", "v3", v3_tokens_per_s, rate),
    }


def by_drafter(
    files: dict[str, Path], fail: set[str] = frozenset()
) -> Callable[[dict[str, Any]], harness.PodChoice]:
    def choose(pod: dict[str, Any]) -> harness.PodChoice:
        drafter = pod["metadata"]["labels"]["kimideploy.io/drafter"]
        extra = {"kimideploy.test/fail-index": "0"} if drafter in fail else {}
        return files.get(drafter), extra

    return choose


def history(kd: Callable[..., tuple[int, str, str]]) -> list[dict[str, Any]]:
    code, out, _ = kd("history", "serve", "-o", "json")
    assert code == 0
    rows: list[dict[str, Any]] = json.loads(out)
    return rows


def gated(
    kd: Callable[..., tuple[int, str, str]], drafter: str, *extra: str
) -> tuple[int, str, str]:
    # The separate baseline: KWOK's pods have no keeper to switch speculation off (the
    # same-server baseline is tests/pipeline/test_drafter_swap.py's, on a real server).
    return kd(
        "up", "serve", "--drafter", drafter, "--gate", "--at-concurrency", "1,8",
        "--gate-baseline", "separate", "--set", QUICK_BENCH, *extra, *FAST,
    )  # fmt: skip


def record_labels(
    testcluster: harness.TestCluster, namespace: str, revision: int
) -> dict[str, str]:
    secret = json.loads(
        testcluster.kubectl(
            "-n",
            namespace,
            "get",
            "secret",
            f"kimideploy.release.kimi-k25-serve.v{revision}",
            "-o",
            "json",
        )
    )
    labels: dict[str, str] = secret["metadata"]["labels"]
    return labels


def rolled_back_by_the_gate(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    where: Path,
    drafter: str,
    tokens_per_s: dict[int, float],
    rate: float,
    min_speedup: str,
) -> str:
    """A gated `up` of `drafter` measured at `tokens_per_s` against 60 / 400 without a drafter
    on a namespace that served nothing: it must end rolled back (exit 4). Returns stderr."""
    files = {
        "none": bench_log(where / "none.log", "none", {1: 60.0, 8: 400.0}, None),
        drafter: bench_log(where / f"{drafter}.log", drafter, tokens_per_s, rate),
    }
    with harness.PodHooks(testcluster, namespace, BENCH_PODS, by_drafter(files)):
        code, _, err = gated(kd, drafter, "--min-speedup", min_speedup)
    assert code == 4, err
    assert [(r["revision"], r["drafter"], r["status"]) for r in history(kd)] == [
        (1, "none", "superseded"),
        (2, drafter, "rolled-back"),
        (3, "none", "deployed"),
    ]
    return err


def test_a_drafter_below_the_threshold_is_rolled_back_to_non_speculative_serving(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    tmp_path: Path,
    observability_binaries: tuple[Path, Path],
) -> None:
    err = rolled_back_by_the_gate(kd, testcluster, namespace, tmp_path, "v3",
                                  {1: 40.0, 8: 390.0}, 0.15, "1.1")  # fmt: skip
    assert "no non-speculative baseline has been measured on cluster rtx6000" in err
    assert "deploying the non-speculative configuration first" in err
    assert "PodMonitor" not in err  # this cluster serves no monitoring.coreos.com CRD
    assert "drafter v3 was rolled back by the gate: below 1.10x at chat c=1 0.67x" in err
    rows = history(kd)
    assert rows[1]["gate"].startswith("rolled back (worst 0.67x, needed 1.10x): below 1.10x")
    assert rows[2]["note"].startswith("gate rollback of revision 2: below 1.10x at chat c=1 0.67x")
    deployment = json.loads(
        testcluster.kubectl("-n", namespace, "get", "deployment", "kimi-k25-serve", "-o", "json")
    )
    assert (
        "--speculative-config"
        not in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    labels = record_labels(testcluster, namespace, 2)
    assert labels["kimideploy.io/gate"] == "rollback"
    assert labels["kimideploy.io/gate-speedup"] == "0.667"
    code, out, _ = kd("status", "-o", "json")
    assert code == 0
    serving = json.loads(out)["serving"]
    assert serving["revision"] == 3 and serving["drafter"] == "none"
    assert serving["gate"].startswith("revision 2 (v3) rolled back (worst 0.67x")
    code, out, _ = kd("status")
    assert "gate" in out and "rolled back" in out
    verdicts_panel_answers_from_the_release_records(testcluster, namespace, tmp_path,
                                                    observability_binaries)  # fmt: skip


def verdicts_panel_answers_from_the_release_records(
    cluster: harness.TestCluster, namespace: str, where: Path, binaries: tuple[Path, Path]
) -> None:
    """The dashboard's gate-verdict panel, evaluated by a real Prometheus over a real
    kube-state-metrics watching this namespace's Secrets with the allowlist the serving guide gives."""
    allowlist = re.search(r"--metric-labels-allowlist=(secrets=\[[^\]]+\])",
                          (REPO / "docs" / "usage" / "serving-and-rollback.md").read_text())  # fmt: skip
    assert allowlist, "the serving guide names the kube-state-metrics allowlist"
    config_map = json.loads(cluster.kubectl("-n", namespace, "get", "configmap",
                                            "kimi-k25-serve-dashboard", "-o", "json"))  # fmt: skip
    [text] = config_map["data"].values()
    variables = {"model": ".*", "__rate_interval": "1m"}  # the vLLM panels' (not checked here)
    queries = observability.panel_queries(json.loads(text), variables)
    [verdicts] = [q for q in queries if "kube_" in q.expr]
    prometheus, ksm = binaries
    with observability.kube_state_metrics(ksm, cluster.kubeconfig, namespace, allowlist.group(1),
                                          where / "ksm.log") as address:  # fmt: skip
        job = {"job_name": "kube-state-metrics", "scrape_interval": "1s", "scrape_timeout": "1s",
               "honor_labels": True, "static_configs": [{"targets": [address]}]}  # fmt: skip
        with observability.prometheus(prometheus, where / "prometheus", [job]) as server:
            [series] = observability.answers(server, [verdicts], timeout=60)[verdicts.expr]
    assert series["metric"] == {
        "namespace": namespace,
        "label_kimideploy_io_release_record": "kimi-k25-serve",
        "label_kimideploy_io_revision": "2",
        "label_kimideploy_io_drafter": "v3",
        "label_kimideploy_io_gate": "rollback",
        "label_kimideploy_io_gate_speedup": "0.667",
    }, series


def test_a_fast_drafter_is_kept_and_the_stored_baseline_is_reused(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    tmp_path: Path,
) -> None:
    files = {
        "none": bench_log(tmp_path / "none.log", "none", {1: 60.0, 8: 400.0}, None),
        "v3": bench_log(tmp_path / "v3.log", "v3", {1: 84.0, 8: 480.0}, 0.62),
        "v2": bench_log(tmp_path / "v2.log", "v2", {1: 78.0, 8: 470.0}, 0.55),
    }
    with harness.PodHooks(testcluster, namespace, BENCH_PODS, by_drafter(files)):
        assert kd("up", "serve", "--drafter", "none", *FAST)[0] == 0
        code, out, err = gated(kd, "v3", "--min-speedup", "1.15")
        assert code == 0, err
        assert "revision 1 already serves without a drafter" in err  # no extra model load
        assert "gate: kept (worst 1.20x, needed 1.15x)" in out
        code, out, err = gated(kd, "v2", "--min-speedup", "1.15")
    assert code == 0, err
    assert "gate: comparing with baseline run" in err
    assert "measuring a fresh" not in err
    rows = history(kd)
    assert [(r["revision"], r["drafter"], r["status"]) for r in rows] == [
        (1, "none", "superseded"),
        (2, "v3", "superseded"),
        (3, "v2", "deployed"),
    ]
    assert rows[1]["gate"].startswith("kept (worst 1.20x, needed 1.15x): at least 1.15x everywhere")
    assert record_labels(testcluster, namespace, 3)["kimideploy.io/gate"] == "keep"
    # Each kept drafter's reference: its acceptance as the gate measured it, on which engine.
    kept = json.loads(testcluster.kubectl(
        "-n", namespace, "get", "configmap", "kimideploy.measured.rtx6000.references",
        "-o", "jsonpath={.data.measurements\\.json}",
    ))  # fmt: skip
    assert [(r["drafter"], r["revision"]) for r in kept] == [("v3", 2), ("v2", 3)]
    assert kept[0]["image"].startswith("ghcr.io/kimideploy/vllm@sha256:")
    assert kept[0]["model_runner"] == "v2" and kept[0]["num_speculative_tokens"] == 3
    assert {lv["acceptance_rate"] for lv in kept[0]["levels"]} == {0.62}
    assert {lv["acceptance_rate"] for lv in kept[1]["levels"]} == {0.55}
    code, out, _ = kd("status", "-o", "json")
    serving = json.loads(out)["serving"]
    assert serving["gate"].startswith("revision 3 (v2) kept")
    # KWOK pods serve no HTTP: the live acceptance says why it is missing instead of guessing.
    assert serving["acceptance"].startswith("unavailable (")
    # The break-even acceptance rate (C - 1) / k at c=1 from rtx6000's prior step cost (no
    # calibration stored): v2 drafts k=5.
    from kimideploy.plan.step_cost import uncalibrated

    project = load_project(REPO / "kimideploy.yaml").project
    k = project.drafters["v2"].num_speculative_tokens
    prior = uncalibrated(project, "rtx6000")
    assert serving["break_even_rate"] == pytest.approx((prior.cost(k, 1) - 1) / k, abs=1e-4)
    code, out, err = kd("bench", "list", "-o", "json")
    assert code == 0, err
    listed = json.loads(out)
    assert [r["drafter"] for r in listed] == ["none", "v3", "v2"]
    chart = tmp_path / "speedup.png"
    code, out, err = kd("bench", "report", listed[1]["run_id"], "--file", str(chart))
    assert code == 0, err
    data = chart.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5000
    assert "chat: c=1 1.40x, c=8 1.20x" in out


def test_a_failing_bench_job_rolls_back_with_the_reason_unless_fail_open(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    tmp_path: Path,
) -> None:
    files = {"none": bench_log(tmp_path / "none.log", "none", {1: 60.0, 8: 400.0}, None)}
    with harness.PodHooks(testcluster, namespace, BENCH_PODS, by_drafter(files, fail={"v3", "v1"})):
        code, _, err = gated(kd, "v3")
        assert code == 4, err
        assert "rolled back by the gate: gate failed: bench run" in err
        assert "failed indexes: 0" in err
        rows = history(kd)
        assert [(r["drafter"], r["status"]) for r in rows][-2:] == [
            ("v3", "rolled-back"),
            ("none", "deployed"),
        ]
        assert "gate failed: bench run" in rows[-2]["gate"]
        code, out, err = gated(kd, "v1", "--gate-fail-open")
    assert code == 0, err
    assert "gate: kept (fail-open): gate failed: bench run" in out
    rows = history(kd)
    assert (rows[-1]["drafter"], rows[-1]["status"]) == ("v1", "deployed")
    assert (
        record_labels(testcluster, namespace, rows[-1]["revision"])["kimideploy.io/gate"]
        == "fail-open"
    )


def test_gate_options_without_gate_and_gate_without_drafter_are_usage_errors(
    kd: Callable[..., tuple[int, str, str]],
) -> None:
    code, _, err = kd("up", "serve", "--drafter", "v3", "--min-speedup", "1.2", *FAST)
    assert code == 2 and "--min-speedup only apply with --gate" in err
    code, _, err = kd("up", "serve", "--drafter", "none", "--gate", *FAST)
    assert code == 2 and "--gate compares a drafter with no drafter" in err


@pytest.fixture
def pod_monitor_crd(testcluster: harness.TestCluster) -> Iterator[None]:
    with served_pod_monitor_crd(testcluster):
        yield


def test_a_pod_monitor_is_rendered_only_where_the_cluster_serves_the_crd(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    pod_monitor_crd: Any,
) -> None:
    code, _, err = kd("up", "serve", "--drafter", "v3", *FAST)
    assert code == 0, err
    assert "create PodMonitor/kimi-k25-serve" in err
    monitor = json.loads(
        testcluster.kubectl("-n", namespace, "get", "podmonitor", "kimi-k25-serve", "-o", "json")
    )
    assert monitor["spec"]["podMetricsEndpoints"] == [
        {"port": "http", "path": "/metrics", "interval": "15s"}
    ]
    assert (
        monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"] == "kimi-k25-serve"
    )
    assert "kimideploy.io/drafter" in monitor["spec"]["podTargetLabels"]
    code, _, err = kd("up", "serve", "--drafter", "none", "--set", "serve.pod_monitor=never", *FAST)
    assert code == 0, err
    assert "prune PodMonitor/kimi-k25-serve" in err
    assert testcluster.kubectl("-n", namespace, "get", "podmonitors", "-o", "name") == ""


def test_watch_reports_unreachable_metrics_and_refuses_a_release_without_a_drafter(
    kd: Callable[..., tuple[int, str, str]],
) -> None:
    assert kd("up", "serve", "--drafter", "v3", *FAST)[0] == 0
    code, out, err = kd("watch", "serve", "--windows", "2", "--interval", "0.1")
    assert code == 0, err
    # (C(3, 1) - 1) / 3 from rtx6000's prior step cost (1.41): docs/reference/step-cost.md
    assert "watching revision 1 (v3, k=3) every 0.1s; break-even acceptance 13.8%" in err
    # KWOK's pods run no vLLM: the API server's pod proxy cannot reach them, and the watch says so.
    assert "acceptance: no window yet (0 pods scraped; unavailable: kimi-k25-serve-" in err
    assert ":8000/metrics failed (" in err
    assert "watched 2 windows" in out
    # -o json: one object per window on stdout (JSON Lines), then the end.
    code, out, err = kd("watch", "serve", "--windows", "2", "--interval", "0.1", "-o", "json")
    assert code == 0, err
    *windows, end = [json.loads(line) for line in out.splitlines()]
    assert [w["window"] for w in windows] == [1, 2] and end == {"end": "watched 2 windows"}
    assert all(w["verdict"] == "no-window" and w["pods_scraped"] == 0 and w["drafter"] == "v3"
               and w["errors"] and w["action"] is None for w in windows)  # fmt: skip
    assert kd("up", "serve", "--drafter", "none", *FAST)[0] == 0
    code, _, err = kd("watch", "serve", "--windows", "1")
    assert code == 2 and "serves without a drafter; there is nothing to watch" in err


def test_a_model_free_method_is_gated_and_watched_as_a_drafter_is(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    tmp_path: Path,
) -> None:
    """n-gram (no weights, no drafter files) goes through the same gate and the same watch: the
    team's hand-measured n-gram on reasoning traffic was slower than none, and that is a rollback."""
    err = rolled_back_by_the_gate(kd, testcluster, namespace, tmp_path, "ngram",
                                  {1: 54.0, 8: 340.0}, 0.2, "1.0")  # fmt: skip
    assert "drafter ngram was rolled back by the gate: below 1.00x at chat c=1 0.90x" in err
    assert kd("up", "serve", "--drafter", "ngram", *FAST)[0] == 0
    code, out, err = kd("watch", "serve", "--windows", "1", "--interval", "0.1")
    assert code == 0, err
    assert "watching revision 4 (ngram, k=3) every 0.1s; break-even acceptance " in err
    assert "watched 1 windows" in out


def test_a_manual_non_speculative_bench_run_becomes_the_gates_baseline(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    tmp_path: Path,
) -> None:
    files = baseline_and_v3(tmp_path, {1: 84.0, 8: 480.0}, 0.62)
    with harness.PodHooks(testcluster, namespace, BENCH_PODS, by_drafter(files)):
        assert kd("up", "serve", "--drafter", "none", *FAST)[0] == 0
        code, _, err = kd("run", "bench", *MANUAL_BENCH)
        assert code == 0, err
        assert "(drafter none) for the gate" in err
        code, out, err = gated(kd, "v3")
    assert code == 0, err
    assert "gate: comparing with baseline run" in err and "measuring a fresh" not in err
    assert "kept" in out


def test_run_bench_with_a_baseline_reports_the_speedup_per_level(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    tmp_path: Path,
) -> None:
    files = baseline_and_v3(tmp_path, {1: 84.0, 8: 480.0}, 0.62)
    bench = MANUAL_BENCH

    def jobs() -> list[str]:
        return testcluster.kubectl("-n", namespace, "get", "jobs", "-o", "name").split()

    with harness.PodHooks(testcluster, namespace, BENCH_PODS, by_drafter(files)):
        assert kd("up", "serve", "--drafter", "none", *FAST)[0] == 0
        # Nothing to compare with yet: refused before a bench Job exists.
        code, _, err = kd("run", "bench", "--baseline", *bench)
        assert code == 2 and "no comparable non-speculative bench run to compare with" in err
        assert "no non-speculative baseline has been measured on cluster rtx6000" in err
        assert jobs() == []
        code, out, err = kd("run", "bench", *bench)
        assert code == 0, err
        assert out.split()[:7] == ["PROMPT_SET", "CONCURRENCY", "TOKENS_PER_S", "ACCEPTANCE_RATE",
                                   "MEAN_ACCEPTANCE_LENGTH", "COUNTED_BY", "TTFT_P50_S"]  # fmt: skip
        assert "SPEEDUP" not in out
        [baseline] = json.loads(kd("bench", "list", "-o", "json")[1])
        assert kd("up", "serve", "--drafter", "v3", *FAST)[0] == 0
        code, out, err = kd("run", "bench", "--drafter", "v3", "--baseline", *bench)
        assert code == 0, err
        assert f"comparing with baseline run {baseline['run_id']}" in err
        rows = [line.split() for line in out.strip().splitlines()]
        assert rows[0][:5] == ["PROMPT_SET", "CONCURRENCY", "TOKENS_PER_S",
                               "BASELINE_TOKENS_PER_S", "SPEEDUP"]  # fmt: skip
        measured = {(r[0], r[1]): (r[3], r[4]) for r in rows[1:]}
        assert measured == {("chat", "1"): ("60.0", "1.4"), ("chat", "8"): ("400.0", "1.2"),
                            ("reasoning", "1"): ("60.0", "1.4"),
                            ("reasoning", "8"): ("400.0", "1.2")}  # fmt: skip
        drafter_run = json.loads(kd("bench", "list", "-o", "json")[1])[-1]["run_id"]
        before = jobs()
        # Refused before a Job exists: another max_tokens does not compare with the baseline, a
        # drafter's run is no baseline, an unknown run is unknown.
        for chosen, message in [
            (baseline["run_id"], "does not compare with this one: the stored baselines used other"),
            (drafter_run, f"bench run {drafter_run} measured drafter v3; a baseline must be"),
            ("nope", "no stored bench run nope of release"),
        ]:
            code, _, err = kd("run", "bench", "--drafter", "v3", "--baseline", chosen,
                              "--set", "bench.max_tokens=64", *bench)  # fmt: skip
            assert code == 2 and message in err, err
        assert jobs() == before


def test_forged_or_future_dated_bench_results_do_not_win_the_gate(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    tmp_path: Path,
) -> None:
    """A stored result is a ConfigMap anyone with write access to the namespace can plant. One
    dated 2099 at 1 tok/s would be the 'newest' baseline forever and keep any drafter; one with a
    number for its date crashed `bench list`. Both are ignored, with the reason."""
    files = {
        "none": bench_log(tmp_path / "none.log", "none", {1: 60.0, 8: 400.0}, None),
        "v3": bench_log(tmp_path / "v3.log", "v3", {1: 62.0, 8: 410.0}, 0.3),
    }
    with harness.PodHooks(testcluster, namespace, BENCH_PODS, by_drafter(files)):
        assert kd("up", "serve", "--drafter", "none", *FAST)[0] == 0
        code, _, err = gated(kd, "v3", "--min-speedup", "1.15")  # measures the real baseline
        assert code == 4, err
        assert kd("up", "serve", "--drafter", "none", *FAST)[0] == 0
        code, out, _ = kd("bench", "list", "-o", "json")
        real = next(r for r in json.loads(out) if r["drafter"] == "none")
        stored = json.loads(testcluster.kubectl("-n", namespace, "get", "configmap",
                                                f"kimideploy.bench.kimi-k25-serve.{real['run_id']}",
                                                "-o", "json"))  # fmt: skip
        forged = json.loads(stored["data"]["bench.json"])
        for level in forged["result"]["levels"]:
            level["output_tokens_per_s"] = 1.0
        plant = {**forged, "run_id": "forged", "measured_at": "2099-01-01T00:00:00+0000"}
        broken = {**forged, "run_id": "broken", "measured_at": 12345}
        for bench in (plant, broken):
            body = {"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": f"kimideploy.bench.kimi-k25-serve.{bench['run_id']}",
                                 "labels": stored["metadata"]["labels"]},
                    "data": {"bench.json": json.dumps(bench)}}  # fmt: skip
            testcluster.kubectl("-n", namespace, "create", "-f", "-", stdin=json.dumps(body))
        code, out, err = kd("bench", "list", "-o", "json")
        assert code == 0 and "Traceback" not in err
        assert not {"forged", "broken"} & {r["run_id"] for r in json.loads(out)}
        assert "measured_at 2099-01-01T00:00:00+0000 is in the future" in err
        assert "measured_at is int, not str" in err
        code, out, err = gated(kd, "v3", "--min-speedup", "1.15")
    assert code == 4, err  # judged against the real baseline: 62 / 60 is not 1.15x
    assert f"comparing with baseline run {real['run_id']}" in err
