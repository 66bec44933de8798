"""What a rented cluster's volumes hold unpublished (services/runs/rental.py): listed from the
config and the cluster's runs, cleared by what the config pins as published."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kimideploy.config.clusters import Rental
from kimideploy.config.datasets import PublishedDataset
from kimideploy.config.loading import load_project
from kimideploy.config.project import Project
from kimideploy.config.registry import OciArtifact
from kimideploy.errors import ConfigError
from kimideploy.plan.data_layout import pipeline_fingerprints
from kimideploy.services.runs.rental import rental_notice
from tests.conftest import EXAMPLE

NOW = datetime(2026, 12, 2, 12, tzinfo=UTC)
DIGEST = "sha256:" + "ab" * 32


def rented(hours: float, **changes: Any) -> Project:
    project = load_project(EXAMPLE).project
    cluster = project.clusters["b300"].model_copy(
        update={"rental": Rental(ends=NOW + timedelta(hours=hours), warn_hours=72)}
    )
    return project.model_copy(update={"clusters": {**project.clusters, "b300": cluster},
                                      **changes})  # fmt: skip


def job(workload: str, drafter: str, run: str, complete: bool = True) -> dict[str, Any]:
    condition = {"type": "Complete" if complete else "Failed", "status": "True"}
    labels = {"app.kubernetes.io/component": workload, "kimideploy.io/drafter": drafter,
              "kimideploy.io/run-id": run}  # fmt: skip
    return {"metadata": {"labels": labels}, "status": {"conditions": [condition]}}


def test_a_cluster_that_is_not_rented_has_no_notice() -> None:
    assert rental_notice(load_project(EXAMPLE).project, "b300", NOW, []) is None


def test_what_runs_made_is_named_by_run_and_the_rest_is_if_made() -> None:
    runs = [job("train", "v3", "t2"), job("train", "v3", "t1"), job("datagen", "v3", "d1", False)]
    notice = rental_notice(rented(200), "b300", NOW, runs)
    assert notice is not None and not notice.warn  # 200 h > 72 h: a note, not yet a warning
    drafter, conversations = notice.unpublished
    assert drafter.evidence == "made by run t2"  # the newest finished one
    assert drafter.command == "kimideploy drafter publish v3 --cluster b300"
    assert conversations.evidence.startswith("if made")  # the datagen run failed
    assert "8.3 days" in notice.headline()


def test_near_and_past_the_end_it_warns() -> None:
    assert rental_notice(rented(71), "b300", NOW, []).warn  # type: ignore[union-attr]
    ended = rental_notice(rented(-5), "b300", NOW, [])
    assert ended is not None and ended.warn and "ended 5 h ago" in ended.headline()


def test_published_drafter_and_conversations_are_not_listed() -> None:
    project = rented(10)
    fields = pipeline_fingerprints(project, "b300")["conversations"]
    from kimideploy.config.fingerprints import fingerprint_id

    dataset = PublishedDataset(oci=OciArtifact(repository="r.example/k/datasets/c", digest=DIGEST),
                               fingerprint=fingerprint_id(fields), made_from=fields, samples=9,
                               made_on="b300")  # fmt: skip
    v3 = project.drafters["v3"]
    source = v3.source.model_copy(
        update={"oci": OciArtifact(repository="r.example/k/drafters/v3", digest=DIGEST)}
    )
    drafters = {**project.drafters, "v3": v3.model_copy(update={"source": source})}
    done = project.model_copy(update={"datasets": {"c": dataset}, "drafters": drafters})
    notice = rental_notice(done, "b300", NOW, [])
    assert notice is not None and notice.unpublished == []
    assert "everything it made is published" in notice.headline()


def rental_config(edited_config: Any, ends: str) -> Any:
    anchor = (
        "    # rental: {ends: 2027-01-31T18:00:00Z, provider: Example GPU Cloud, warn_hours: 72,\n"
        "    #          margin_hours: 2}     # `run` refuses what would reach into the last 2 hours\n"
    )
    return edited_config((anchor, f"    rental: {{ends: {ends}, warn_hours: 72}}\n"))


def test_the_notice_announces_the_end_in_utc_whatever_zone_it_was_written_in(
    edited_config: Any,
) -> None:
    project = load_project(rental_config(edited_config, "2026-12-04T18:00:00+05:30")).project
    assert project.clusters["b300"].rental.ends == datetime(2026, 12, 4, 12, 30, tzinfo=UTC)
    notice = rental_notice(project, "b300", NOW, [])
    assert notice is not None and "(2026-12-04 12:30 UTC)" in notice.headline()
    assert notice.hours_left == 48.5


@pytest.mark.parametrize(
    ("ends", "why"),
    [
        ("2027-02-30", "not a date on the calendar"),
        ('"2027-02-30"', "not a date on the calendar"),
        ("2026-12-31T23:59:60Z", "clusters.b300.rental.ends"),
        ("2026-13-01T00:00:00Z", "clusters.b300.rental.ends"),
    ],
)
def test_an_impossible_end_is_a_config_error_with_its_line(
    edited_config: Any, ends: str, why: str
) -> None:
    path = rental_config(edited_config, ends)
    with pytest.raises(ConfigError) as info:
        load_project(path)
    text = str(info.value) + "\n".join(getattr(info.value, "issues", []) or [])
    assert why in text and "clusters.b300.rental.ends" in text, text
    line = next(n for n, t in enumerate(path.read_text().splitlines(), 1) if "rental: {ends" in t)
    assert f":{line}" in text, text
