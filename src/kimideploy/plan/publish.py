"""Publishing through the registry: the publish Job's spec and mounts, and the pull a serve pod
does before anything reads a published drafter. Credentials stay in the cluster's Secrets (a
dockerconfigjson mounted read-only into the one container that talks to the registry); the
config and the rendered manifests only name them."""

from __future__ import annotations

from typing import Any

from kimideploy.config.drafters import Drafter, to_vllm_layer_ids
from kimideploy.config.registry import Registry
from kimideploy.config.specs import (
    REGISTRY_MOUNT,
    SPEC_PATH,
    PublishSpec,
    PulledArtifact,
    RegistryAccess,
)
from kimideploy.errors import UsageError
from kimideploy.plan import pods
from kimideploy.plan.asks import PublishAsk, PullAsk, ReplayAsk
from kimideploy.plan.data_layout import data_dirs, data_flow, published_conversations
from kimideploy.plan.inputs import (
    DATASETS_MOUNT,
    MODELS_MOUNT,
    PlanInputs,
    drafter_path,
    published_dataset_path,
    trained_path,
)

PULL_CONTAINER = "artifact-pull"
CA_FILE = "ca.crt"
CA_MOUNT = "/var/run/secrets/kimideploy/registry-ca"


def require_registry(ctx: PlanInputs, why: str) -> Registry:
    registry = ctx.project.registry
    if registry is None:
        raise UsageError(
            f"{why}, but kimideploy.yaml names no registry",
            hint="add `registry: {repository: ..., push_secret: ..., pull_secret: ...}` "
            "(docs/usage/moving-a-drafter.md)",
        )
    return registry


def access(registry: Registry) -> RegistryAccess:
    ca = f"{CA_MOUNT}/{CA_FILE}" if registry.ca_secret else None
    return RegistryAccess(ca_file=ca, plain_http=registry.plain_http)


def secret_volumes(registry: Registry, secret: str) -> tuple[list[Any], list[Any]]:
    """The credentials (and the CA) as read-only files where ORAS reads them."""
    volumes: list[dict[str, Any]] = [
        {
            "name": "registry-auth",
            "secret": {
                "secretName": secret,
                "items": [{"key": ".dockerconfigjson", "path": ".dockerconfigjson"}],
            },
        }
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "registry-auth", "mountPath": REGISTRY_MOUNT, "readOnly": True}
    ]
    if registry.ca_secret:
        volumes.append(
            {
                "name": "registry-ca",
                "secret": {
                    "secretName": registry.ca_secret,
                    "items": [{"key": CA_FILE, "path": CA_FILE}],
                },
            }
        )
        mounts.append({"name": "registry-ca", "mountPath": CA_MOUNT, "readOnly": True})
    return volumes, mounts


def artifact_annotations(ctx: PlanInputs, drafter: Drafter) -> dict[str, str]:
    """What a reader of the registry can know without pulling; the pod adds what only the
    drafter's lineage file says (held-out acceptance, dataset fingerprint, step)."""
    model = ctx.project.model_for(ctx.cluster_name)
    ids = to_vllm_layer_ids(drafter.aux_layer_ids, drafter.layer_id_convention)
    return {
        "org.opencontainers.image.title": f"kimideploy drafter {ctx.drafter_name}",
        "io.kimideploy.target": model.repo,
        "io.kimideploy.target.revision": model.revision,
        "io.kimideploy.target.variant": ctx.cluster.model_variant or "default",
        "io.kimideploy.layer-ids": ",".join(map(str, ids)),
        "io.kimideploy.layer-id-convention": "vllm",
        "io.kimideploy.num-speculative-tokens": str(drafter.num_speculative_tokens),
        "io.kimideploy.draft-vocab-size": str(drafter.draft_vocab_size),
        "io.kimideploy.trained-on-cluster": ctx.cluster_name,
        "io.kimideploy.version": _version(),
    }


def publish_spec(ctx: PlanInputs, run_id: str, to: str | None) -> PublishSpec:
    dataset = ctx.asked(PublishAsk).dataset
    if dataset is not None:
        return _dataset_spec(ctx, run_id, dataset, to)
    drafter = ctx.drafter
    if drafter is None:
        raise UsageError("publish needs a drafter: `kimideploy drafter publish NAME --cluster C`")
    registry = require_registry(ctx, f"drafter publish {ctx.drafter_name}")
    if drafter.source.hub is not None:
        raise UsageError(
            f"drafter {ctx.drafter_name} comes from the hub, not from a cluster's volume: there "
            "is nothing to publish",
            hint="publish a drafter a `run train` wrote (source.path)",
        )
    return PublishSpec(
        run_id=run_id,
        cluster=ctx.cluster_name,
        target=ctx.target_ref(),
        kind="drafter",
        name=ctx.drafter_name,
        source_dir=trained_path(ctx.drafter_name, drafter),
        repository=to or registry.drafter_repository(ctx.drafter_name),
        tag=f"run-{run_id}",
        annotations=artifact_annotations(ctx, drafter),
        registry=access(registry),
    )


def _dataset_spec(ctx: PlanInputs, run_id: str, name: str, to: str | None) -> PublishSpec:
    """`data publish NAME --cluster C`: the conversations of C's pipeline (its train drafter's), as
    its datagen writes them."""
    registry = require_registry(ctx, f"data publish {name}")
    taken = published_conversations(ctx)
    if taken is not None:
        raise UsageError(
            f"cluster {ctx.cluster_name} takes its conversations from dataset {taken[0]}, "
            f"published already as {taken[1].oci.reference}",
            hint="publish from the cluster that generated them",
        )
    model = ctx.model
    annotations = {
        "org.opencontainers.image.title": f"kimideploy conversations {name}",
        "io.kimideploy.target": model.repo,
        "io.kimideploy.target.revision": model.revision,
        "io.kimideploy.made-on-cluster": ctx.cluster_name,
        "io.kimideploy.made-for-drafter": ctx.cluster.workloads.train.drafter,
        "io.kimideploy.version": _version(),
    }
    return PublishSpec(
        run_id=run_id,
        cluster=ctx.cluster_name,
        target=ctx.target_ref(),
        kind="conversations",
        name=name,
        source_dir=data_dirs(ctx)["conversations"],
        repository=to or registry.dataset_repository(name),
        tag=f"run-{run_id}",
        annotations=annotations,
        registry=access(registry),
    )


def pulls(ctx: PlanInputs) -> list[PulledArtifact]:
    """The published artifacts this workload's pods read, pulled by their first init container:
    the served drafter (serve), the drafters replayed (replay), the drafter fine-tuned from
    (train), and the conversations a
    pipeline takes from the registry (extract, vocab, online train)."""
    found: list[PulledArtifact] = []
    names: list[str] = []
    pulls, base = ctx.kind.pulls, ctx.cluster.workloads.train.base_drafter
    if pulls == "served" and ctx.drafter is not None:
        names.append(ctx.drafter_name)
    if pulls == "replayed":
        names += list(ctx.asked(ReplayAsk).drafters or (ctx.drafter_name,))
    if pulls == "pulled":
        names += list(ctx.asked(PullAsk).drafters or (ctx.drafter_name,))
    if pulls == "base" and base:
        names.append(base)
    for name in names:
        drafter = ctx.project.eagle_drafter(name)
        if drafter.source.oci is not None:
            registry = require_registry(ctx, f"drafter {name} is a published artifact")
            found.append(
                PulledArtifact(
                    kind="drafter",
                    name=name,
                    reference=drafter.source.oci.reference,
                    dest=drafter_path(name, drafter),
                    files=dict(drafter.source.oci.files),
                    registry=access(registry),
                )
            )
    dataset = ctx.cluster.workloads.train.conversations
    if dataset and "conversations" in data_flow(ctx)[0]:
        published = ctx.project.datasets[dataset]
        registry = require_registry(ctx, f"dataset {dataset} is a published artifact")
        found.append(
            PulledArtifact(
                kind="conversations",
                name=dataset,
                reference=published.oci.reference,
                dest=published_dataset_path(published),
                files=dict(published.oci.files),
                registry=access(registry),
                fingerprint=published.fingerprint,
            )
        )
    return found


def pull_container(
    ctx: PlanInputs,
    artifacts: list[PulledArtifact],
    spec_mount: dict[str, Any],
    writable: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """The first init container when the pod reads a published artifact: it fetches each onto
    its volume (once per digest) and verifies it before anything reads it; the only container
    of the pod that writes to those volumes."""
    if not artifacts:
        return []
    registry = require_registry(ctx, "a published artifact is pulled")
    _, auth_mounts = secret_volumes(registry, registry.pull_secret)
    volumes = {"drafter": ("models", MODELS_MOUNT), "conversations": ("datasets", DATASETS_MOUNT)}
    mounts = [
        {"name": name, "mountPath": path}
        for name, path in sorted({volumes[a.kind] for a in artifacts})
    ]
    return [
        {
            "name": PULL_CONTAINER,
            "image": ctx.image.reference,
            "command": [
                "python",
                "-m",
                "kimideploy.workloads",
                PULL_CONTAINER,
                "--spec",
                SPEC_PATH,
            ],
            "resources": pods.resources("1", "1Gi", 0),
            "volumeMounts": [*mounts, spec_mount, *auth_mounts, *writable],
            "securityContext": pods.container_hardening(),
        }
    ]


def pull_volumes(ctx: PlanInputs, artifacts: list[PulledArtifact]) -> list[dict[str, Any]]:
    if not artifacts:
        return []
    registry = require_registry(ctx, "a published artifact is pulled")
    return secret_volumes(registry, registry.pull_secret)[0]


def _version() -> str:
    # Imported here: importlib.metadata (with zipfile, csv and email) is a tenth of every
    # command's start-up, and only a publish or pull plan reads the installed version.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kimideploy")
    except PackageNotFoundError:
        return "unknown"
