"""The truth after a run, on the control plane: a finished run's rate and fixed part are kept in
the cluster's store, `run` says what it took against its prediction, and the next plan of that
workload on the cluster (`run --dry-run=server`, `plan lifecycle --measured`) is estimated from
it. The model itself: tests/unit/test_estimates.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from kimideploy.cluster.measurements import DATA_KEY, config_map_name
from tests.integration.conftest import harness, rented_train_logs

pytestmark = pytest.mark.integration

PROGRESS = [
    '{"event": "progress", "stage": "train", "done": 120, "total": 120, "unit": "steps", '
    '"rate": 40.0}',
    '{"event": "result", "loss": 1.1}',
]


def test_a_finished_run_is_kept_and_the_next_plan_is_estimated_from_it(
    kd: Callable[..., tuple[int, str, str]],
    testcluster: harness.TestCluster,
    namespace: str,
    tmp_path: Path,
) -> None:
    rented_train_logs(testcluster, namespace, tmp_path / "train.log", PROGRESS)
    duration = "train.pod_annotations=" + json.dumps({"kimideploy.test/run-duration": "4s"})
    quick = ("--cluster", "b300", "--set", "train.nodes=1", "--set", duration)
    code, out, err = kd("run", "train", *quick, "--poll", "0.3", "-o", "json")
    assert code == 0, err
    document = json.loads(out)
    estimate, actual = document["estimate"], document["actual"]
    assert estimate["source"].startswith("prior") and estimate["gpus"] == 8
    assert actual["unit"] == "steps" and actual["rate"] == 40.0
    assert actual["wall_s"] >= 4 and actual["predicted_s"] == estimate["seconds"]
    assert actual["money"] == pytest.approx(8 * actual["wall_s"] / 3600 * 6.0, abs=0.01)
    run_id = document["run"]["id"]

    stored = json.loads(testcluster.kubectl(
        "-n", namespace, "get", "configmap", config_map_name("b300", "rates"), "-o", "json"
    ))  # fmt: skip
    [kept] = json.loads(stored["data"][DATA_KEY])
    assert (kept["workload"], kept["run_id"], kept["rate"]) == ("train", run_id, 40.0)
    # Everything but the 3 s of steps (120 at 40/s) was its fixed part.
    assert kept["startup_s"] == pytest.approx(actual["wall_s"] - 3.0, abs=0.2)

    code, out, err = kd("run", "train", *quick, "--dry-run", "server", "-o", "json")
    assert code == 0, err
    planned = json.loads(out)["plan"]["estimate"]
    assert planned["measured"] and f"measured by run {run_id}" in planned["source"]
    # The plan's own steps at the measured rate, after the measured fixed part.
    assert planned["seconds"] == pytest.approx(kept["startup_s"] + planned["units"] / 40.0)
    assert not json.loads(testcluster.kubectl("-n", namespace, "get", "jobs", "-o", "json"))[
        "items"
    ][1:]  # the dry run created nothing: the one Job is the finished run's

    code, out, err = kd("plan", "lifecycle", "--cluster", "b300", "--measured", "-o", "json")
    assert code == 0, err
    stages = {s["workload"]: s for s in json.loads(out)["stages"]}
    assert stages["train"]["measured"] and not stages["datagen"]["measured"]
