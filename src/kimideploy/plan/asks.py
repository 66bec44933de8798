"""What a user asks of one workload beyond the workload, cluster, drafter and overrides every
request has: each kind's own ask type (plan/kinds.py names it), so a bench level list cannot be
handed to a publish, and a request carries only what its workload reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SyntheticAcceptance:
    """`run calibrate`: serve with k drafts accepted at synthetic lengths (the first at start-up,
    the others set by the bench between passes), and bench every length."""

    num_speculative_tokens: int
    acceptance_lengths: tuple[float, ...]


@dataclass(frozen=True, kw_only=True)
class ServeAsk:
    image: str | None = None
    """Another image of role serve than the cluster's (`run calibrate --image`)."""
    synthetic: SyntheticAcceptance | None = None
    """`run calibrate`'s revision: k drafts accepted at synthetic lengths."""
    canary_percent: int | None = None
    """Render the drafter as a canary pool taking this share of the route's traffic beside the
    serving pool (`up serve --canary`), instead of as the release itself."""
    gate_levels: tuple[int, ...] | None = None
    """The gate's levels instead of the cluster's (`--at-concurrency`): the break-even the plan
    shows and the gate decides at."""
    gate_min_speedup: float | None = None
    """The gate's threshold instead of the cluster's (`--min-speedup`): what the plan's gate line
    and predictions are judged against, as the gate itself is."""
    speculation_off: bool = False
    """Serve the drafter with speculation switched off (spec `speculation: false`): the form a
    non-speculative revision takes on a server that can switch (`rollback serve --no-spec`, `up
    serve --drafter none`), applied to the running pods instead of a reload."""


@dataclass(frozen=True, kw_only=True)
class BenchAsk:
    concurrency: tuple[int, ...] | None = None
    """The concurrency levels to measure instead of the cluster's (the gate's levels)."""
    synthetic: SyntheticAcceptance | None = None
    """`run calibrate`'s bench: every synthetic length of the revision it measures."""


@dataclass(frozen=True, kw_only=True)
class PublishAsk:
    to: str | None = None
    """The repository to push to instead of the registry's <repository>/drafters/NAME."""
    dataset: str | None = None
    """Push the cluster's pipeline conversations as this dataset (`data publish`)."""


@dataclass(frozen=True, kw_only=True)
class ReplayAsk:
    drafters: tuple[str, ...] = ()
    """The drafters judged (`drafter doctor A B`); empty: the one named by `drafter`."""
    prompts: tuple[tuple[str, tuple[dict[str, Any], ...]], ...] = ()
    """(name, rows) of the user's prompt sets ({id, messages[, tools]} rows)."""


@dataclass(frozen=True, kw_only=True)
class PullAsk:
    drafters: tuple[str, ...] = ()
    """The published drafters fetched onto the cluster's models volume."""


WorkloadAsk = ServeAsk | BenchAsk | PublishAsk | ReplayAsk | PullAsk
