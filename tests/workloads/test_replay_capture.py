"""replay-capture refuses a drafter that is not on the cluster's models volume before the
tokenizer, the engine or any capture: naming the path and how a drafter gets there (the serving
engine's capture itself runs in tests/pipeline/test_doctor.py)."""

from __future__ import annotations

from pathlib import Path

from kimideploy.config.loading import LoadedProject
from kimideploy.config.specs import ReplaySpec
from kimideploy.plan.model import PlanRequest
from kimideploy.services.rendering import render_workload
from tests.workloads.conftest import run_workload, workloads_python


def test_a_drafter_missing_from_the_volume_is_refused_before_the_engine(
    example: LoadedProject, tmp_path: Path
) -> None:
    rendered = render_workload(example, PlanRequest("replay", "rtx6000", "v3"))
    spec = ReplaySpec.model_validate(rendered.plan.spec.model_dump())
    missing = tmp_path / "models" / "drafters" / "v3"
    here = spec.model_copy(update={
        "drafters": [spec.drafters[0].model_copy(update={"path": str(missing)})],
        "capture_dir": str(tmp_path / "capture"),
    })  # fmt: skip
    path = tmp_path / "spec.json"
    path.write_text(here.model_dump_json())
    pod = run_workload("replay-capture", path, str(workloads_python()))
    _, err = pod.communicate(timeout=120)
    assert pod.returncode == 2, err
    assert f"drafter v3: {missing} is not on this cluster's models volume" in err
    assert "kimideploy drafter publish v3 --cluster CLUSTER" in err and "Traceback" not in err
    assert not (tmp_path / "capture").exists()  # nothing written
