"""What the cluster's nodes can never hold is refused offline, before any cluster is contacted."""

from __future__ import annotations

import pytest

from kimideploy.config.loading import LoadedProject
from kimideploy.errors import UsageError
from kimideploy.plan.model import PlanRequest
from kimideploy.plan.resolve import resolve


def test_more_serve_replicas_than_the_nodes_hold_is_refused(example: LoadedProject) -> None:
    with pytest.raises(UsageError) as info:
        resolve(example, PlanRequest("serve", "rtx6000", "none", ("serve.replicas=3",)))
    assert str(info.value.message) == (
        "serve.replicas 3 needs 24 GPUs (8 each); cluster rtx6000 has 1 node(s) of 8 GPUs"
    )
    assert info.value.exit_code == 2 and "serve.replicas=1" in (info.value.hint or "")
    resolve(example, PlanRequest("serve", "rtx6000", "none", ("serve.replicas=1",)))
    nodes = example.project.clusters["b300"].nodes
    resolve(example, PlanRequest("serve", "b300", "none", (f"serve.replicas={nodes}",)))
