"""What each workload is, in one record: the resolver, the jobs, the claims and the data layout read
a workload's kind instead of comparing its name.

A kind holds facts (which image runs it, which drafter it defaults to, which claims it mounts,
what it reads and writes); how its spec, its Job and its pods are built stays with the modules
that build them (resolve's spec table, jobs' shape table), keyed by the kind's name and tested to
cover every kind. The facts cannot hold those builders: the builders read PlanInputs, which reads
its kind from here, and an import cycle is a module in the wrong room.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from kimideploy.config.workload_names import WORKLOAD_NAMES
from kimideploy.plan.asks import BenchAsk, PublishAsk, PullAsk, ReplayAsk, ServeAsk, WorkloadAsk

FEATURES = "features"
"""In `reads`: what training learns from, the stored hidden states, or the conversations the
online target server turns into hidden states per sample."""


@dataclass(frozen=True, kw_only=True)
class WorkloadKind:
    name: str
    release: bool = False
    """The serve release: one Deployment `up` rolls out and `rollback` restores, no run id. Every
    other kind is a new, immutable Job per run."""
    images: tuple[str, ...]
    """The cluster's `images:` entries that run it, the first one set."""
    settings: str
    """The cluster's `workloads:` entry whose resources and annotations its pods take."""
    default_drafter: Literal["none", "train drafter", "pulled", "never"] = "none"
    """With no --drafter: no drafter, the cluster's train drafter, the first drafter pulled;
    "never" takes none even when named (the weights download)."""
    for_eagle_drafter: bool = False
    """It builds, publishes or judges data for an EAGLE-3 drafter and needs its layer ids."""
    model_free_refusal: tuple[str, str] | None = None
    """(reason, hint) when a model-free method is named: said before the generic refusal."""
    gpus: bool = False
    """Its pods hold GPUs (the image must be built for the cluster's arch)."""
    trains_for_serving: bool = False
    """It makes a drafter for this cluster: the plan says what acceptance the gate needs and
    whether the serve stack can pay for drafting at all."""
    trains: bool = False
    """The training run itself: lineage findings, the base drafter it fine-tunes from."""
    plans_hidden_states: bool = False
    """The plan says how large the hidden states are and where they live."""
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    """Dataset folders (data_layout.data_dirs keys; FEATURES resolved by the training mode)."""
    measures_serving: bool = False
    """Its figures are the serve configuration's: the record keeps that configuration's
    fingerprint, so a stored bench is matched to the stack it measured."""
    engine: str | None = None
    """The vLLM engine its main pod starts, as the memory plan names it; None for none (online
    training's target server is planned from the training mode)."""
    reads_weights: bool = False
    """Its pods read the downloaded target: a weights probe runs first where a Job downloads."""
    claims: Mapping[str, bool] = field(default_factory=dict)
    """Claim -> mounted read-only. Online training drops the hidden states (claims.py)."""
    retries: int = 1
    """backoffLimitPerIndex: how often one index is retried."""
    pulls: Literal["served", "replayed", "pulled", "base", "none"] = "none"
    """Which drafters its first init container pulls from the registry (published ones only)."""
    ask: type[WorkloadAsk] | None = None
    """What a request of this kind may ask besides the common fields (plan/asks.py); None:
    nothing."""


_REPLAY_REFUSAL = (
    "the replay judges EAGLE-3 drafters; model-free methods have nothing to replay offline",
    "`kimideploy run bench --drafters ...` measures them served",
)

# Every GPU workload compiles kernels at run time and keeps them on the compile cache.
KINDS: dict[str, WorkloadKind] = {
    kind.name: kind
    for kind in (
        WorkloadKind(
            name="datagen",
            images=("datagen",),
            settings="datagen",
            default_drafter="train drafter",
            for_eagle_drafter=True,
            trains_for_serving=True,
            plans_hidden_states=True,
            writes=("conversations",),
            claims={"datasets": False},
            retries=5,  # its requests are idempotent
        ),
        WorkloadKind(
            name="extract",
            images=("extract",),
            settings="extract",
            default_drafter="train drafter",
            for_eagle_drafter=True,
            gpus=True,
            plans_hidden_states=True,
            reads=("conversations",),
            writes=("hidden_states",),
            engine="extraction",
            reads_weights=True,
            claims={
                "models": True,
                "datasets": True,
                "hidden_states": False,
                "compile_cache": False,
            },
            retries=3,
        ),
        WorkloadKind(
            name="vocab",
            images=("vocab",),
            settings="vocab",
            default_drafter="train drafter",
            for_eagle_drafter=True,
            reads=("conversations",),
            writes=("vocab",),
            claims={"datasets": False},
            retries=2,
        ),
        WorkloadKind(
            name="train",
            images=("train",),
            settings="train",
            default_drafter="train drafter",
            for_eagle_drafter=True,
            gpus=True,
            trains_for_serving=True,
            trains=True,
            plans_hidden_states=True,
            reads=(FEATURES, "vocab"),
            reads_weights=True,
            # Training writes the finished drafter onto the models volume.
            claims={
                "models": False,
                "datasets": True,
                "hidden_states": True,
                "checkpoints": False,
                "compile_cache": False,
            },
            retries=2,
            pulls="base",
        ),
        WorkloadKind(
            name="bench",
            ask=BenchAsk,
            images=("bench",),
            settings="bench",
            measures_serving=True,
            claims={"datasets": False},
        ),
        WorkloadKind(
            name="publish",
            ask=PublishAsk,
            images=("publish", "vocab"),  # a CPU image that has the ORAS CLI
            settings="publish",
            default_drafter="train drafter",
            for_eagle_drafter=True,
            # Writable datasets: `data publish` holds each shard's writer lock while it pushes.
            claims={"models": True, "datasets": False},
            retries=3,  # a push skips the blobs already there
        ),
        WorkloadKind(
            name="replay",
            ask=ReplayAsk,
            # The judgement; the capture container names its own image.
            images=("train",),
            settings="extract",  # the capture runs in the extraction's shape
            default_drafter="train drafter",
            for_eagle_drafter=True,
            model_free_refusal=_REPLAY_REFUSAL,
            engine="replay capture",
            reads_weights=True,
            # The captured sequences are kept on the hidden-states claim (reused, resumed).
            claims={"models": True, "hidden_states": False, "compile_cache": False},
            pulls="replayed",
        ),
        WorkloadKind(
            name="pull",
            ask=PullAsk,
            images=("serve",),  # what the serve pod's own artifact-pull runs on
            settings="publish",  # it moves an artifact between the registry and a volume
            default_drafter="pulled",
            # The pull is the one container that writes the drafters it fetches.
            claims={"models": False},
            retries=3,  # ORAS resumes from the blobs already there
            pulls="pulled",
        ),
        WorkloadKind(
            name="weights",
            images=("publish", "vocab"),  # a CPU image: the downloader is stdlib
            settings="weights",
            default_drafter="never",
            # The weights download writes the target (and hub drafters) into the models claim.
            claims={"models": False},
            retries=3,  # the downloader resumes every piece from its journal
        ),
        WorkloadKind(
            name="serve",
            ask=ServeAsk,
            release=True,
            images=("serve",),
            settings="serve",
            gpus=True,
            measures_serving=True,
            engine="serve",
            reads_weights=True,
            claims={"models": True, "compile_cache": False},
            pulls="served",
        ),
    )
}
assert tuple(KINDS) == WORKLOAD_NAMES, "one kind per workload name, in the names' order"
