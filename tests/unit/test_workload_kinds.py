"""Every workload is one kind (plan/kinds.py), and every per-kind table covers exactly the kinds."""

from __future__ import annotations

import pytest

from kimideploy.config.loading import LoadedProject
from kimideploy.config.workload_names import GPU_WORKLOADS, WORKLOAD_NAMES
from kimideploy.config.workloads import Workloads
from kimideploy.plan import jobs, resolve
from kimideploy.plan.asks import BenchAsk, PublishAsk, PullAsk, ReplayAsk, ServeAsk
from kimideploy.plan.kinds import KINDS
from kimideploy.plan.model import PlanRequest, pull_ask


def test_every_workload_name_has_one_kind_and_one_settings_entry() -> None:
    assert tuple(KINDS) == WORKLOAD_NAMES
    settings = set(Workloads.model_fields)
    for name, kind in KINDS.items():
        assert kind.name == name
        assert kind.settings in settings, f"{name}: workloads.{kind.settings} does not exist"
    assert {name for name, kind in KINDS.items() if kind.gpus} == GPU_WORKLOADS
    assert [name for name, kind in KINDS.items() if kind.release] == ["serve"]


def test_the_builders_keyed_by_kind_name_only_name_kinds_and_jobs_get_a_shape() -> None:
    for table in (jobs._SHAPES, jobs._POD_PARTS, jobs._STAGES):
        assert set(table) <= set(KINDS), sorted(set(table) - set(KINDS))
    assert set(resolve.SPEC_BUILDERS) == set(KINDS)


def test_a_kind_that_pulls_its_own_drafters_defaults_to_them() -> None:
    """The facts that go together: a kind whose container is the pull names the drafters it
    pulls; a kind judged for an EAGLE-3 drafter defaults to the train drafter."""
    for name, kind in KINDS.items():
        if kind.pulls == "pulled":
            assert kind.default_drafter == "pulled", name
        if kind.model_free_refusal is not None:
            assert kind.for_eagle_drafter, name
        if kind.for_eagle_drafter:
            assert kind.default_drafter == "train drafter", name


def test_a_request_carries_only_what_its_kind_asks(example: LoadedProject) -> None:
    """Each kind names its own ask type; a request with another kind's ask is a mistake in the
    caller, refused before anything is planned, and a plan reads its kind's defaults when none
    was asked."""
    asks = {name: kind.ask for name, kind in KINDS.items() if kind.ask is not None}
    assert asks == {"bench": BenchAsk, "publish": PublishAsk, "replay": ReplayAsk,
                    "pull": PullAsk, "serve": ServeAsk}  # fmt: skip
    with pytest.raises(TypeError, match="a BenchAsk is not what workload serve takes"):
        resolve.resolve(example, PlanRequest("serve", "b300", "v3", ask=BenchAsk()))
    with pytest.raises(TypeError, match=r"workload train takes \(no ask\)"):
        resolve.resolve(example, PlanRequest("train", "b300", ask=ServeAsk()))
    assert PlanRequest("serve").asked(ServeAsk) == ServeAsk()
    assert pull_ask("pull", ("k25",)) == PullAsk(drafters=("k25",))
    assert pull_ask("serve", ("k25",)) is None
    asked = PlanRequest("bench", "b300", "v3", ask=BenchAsk(concurrency=(2,)))
    spec = resolve.resolve(example, asked).spec
    assert list(spec.concurrency) == [2]  # type: ignore[attr-defined]
