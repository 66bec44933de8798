"""Where a drafter's pipeline keeps its data, and what each dataset is made from: the folder
names (by fingerprint id, config.fingerprints) that every stage's spec and `data publish` use,
and the published conversations a cluster may take instead of generating its own."""

from __future__ import annotations

from typing import Any

from kimideploy.config.datasets import PublishedDataset
from kimideploy.config.drafters import to_vllm_layer_ids
from kimideploy.config.fingerprints import fingerprint_id
from kimideploy.config.project import Project
from kimideploy.plan import online
from kimideploy.plan.inputs import (
    CHECKPOINTS_MOUNT,
    DATASETS_MOUNT,
    HIDDEN_STATES_MOUNT,
    PlanInputs,
    published_dataset_path,
)
from kimideploy.plan.kinds import FEATURES


def dataset_fingerprints(ctx: PlanInputs) -> dict[str, dict[str, Any]]:
    """What each dataset of the train drafter's pipeline is made from (config.fingerprints)."""
    return pipeline_fingerprints(ctx.project, ctx.cluster_name)


def pipeline_fingerprints(project: Project, cluster_name: str) -> dict[str, dict[str, Any]]:
    """What each dataset of a cluster's pipeline (its train drafter's) is made from.

    `samples` is not part of the conversations' fingerprint: raising it adds samples to the same
    folder (each shard's prompts are a prefix of a larger run's). The features' includes the
    conversations' id, so new conversations also mean new features."""
    cluster = project.clusters[cluster_name]
    model, workloads = project.model_for(cluster_name), cluster.workloads
    datagen, extract = workloads.datagen, workloads.extract
    drafter = project.eagle_drafter(workloads.train.drafter)
    target = {"repo": model.repo, "revision": model.revision}
    published = _published(project, cluster_name)
    conversations = (
        published[1].made_from
        if published
        else {
            "stage": "datagen",
            "target": target,
            "prompts": datagen.prompts,
            "endpoint": datagen.endpoint,
            "sampling": {
                "max_tokens": datagen.max_tokens,
                "temperature": datagen.temperature,
                "top_p": datagen.top_p,
            },
            "shards": datagen.shards,
        }
    )
    extract_image = project.images[cluster.images.extract]
    engine = f"vllm {extract_image.vllm}" if extract.backend == "vllm" else "transformers"
    features = {
        "stage": "extract",
        "conversations": fingerprint_id(conversations),
        "target": target,
        "layers": {
            "ids": list(drafter.aux_layer_ids),
            "convention": drafter.layer_id_convention,
            "vllm_ids": to_vllm_layer_ids(drafter.aux_layer_ids, drafter.layer_id_convention),
        },
        "dtype": extract.dtype,
        "backend": extract.backend,
        "engine": engine,
        "shards": extract.shards,
    }
    vocab = {
        "stage": "vocab",
        "conversations": fingerprint_id(conversations),
        "draft_vocab_size": drafter.draft_vocab_size,
    }
    return {"conversations": conversations, "hidden_states": features, "vocab": vocab}


def published_conversations(ctx: PlanInputs) -> tuple[str, PublishedDataset] | None:
    """The published dataset this cluster's pipeline reads instead of generating its own."""
    return _published(ctx.project, ctx.cluster_name)


def _published(project: Project, cluster_name: str) -> tuple[str, PublishedDataset] | None:
    name = project.clusters[cluster_name].workloads.train.conversations
    return (name, project.datasets[name]) if name else None


def conversations_id(project: Project, cluster_name: str) -> str:
    """The fingerprint id of the conversations the cluster's pipeline makes (or takes)."""
    return fingerprint_id(pipeline_fingerprints(project, cluster_name)["conversations"])


def data_flow(ctx: PlanInputs) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(read, written) data_dirs keys of this plan's run, from its kind; training reads the
    conversations instead of stored hidden states when its target server computes them."""
    features = "conversations" if online.is_online(ctx) else "hidden_states"
    reads = tuple(features if name == FEATURES else name for name in ctx.kind.reads)
    return reads, ctx.kind.writes


def data_dirs(ctx: PlanInputs) -> dict[str, str]:
    """Where one drafter's data lives: keyed by the drafter the pipeline is building, and each
    dataset by its fingerprint id (what made it), so no run reads or extends another's data."""
    drafter = ctx.cluster.workloads.train.drafter if ctx.workload != "bench" else ctx.drafter_name
    base = f"{DATASETS_MOUNT}/pipelines/{drafter}"
    ids = {name: fingerprint_id(f) for name, f in dataset_fingerprints(ctx).items()}
    published = published_conversations(ctx)
    conversations = f"{base}/conversations/{ids['conversations']}"
    if published:  # pulled by digest: one folder per artifact, whichever pipeline reads it
        conversations = published_dataset_path(published[1])
    return {
        "conversations": conversations,
        "vocab": f"{base}/vocab/{ids['vocab']}",
        "bench": f"{DATASETS_MOUNT}/bench",
        "hidden_states": f"{HIDDEN_STATES_MOUNT}/{drafter}/{ids['hidden_states']}",
        "checkpoints": f"{CHECKPOINTS_MOUNT}/{drafter}",
    }
