"""The root of kimideploy.yaml and the cross-references pydantic cannot check field by field."""

from collections.abc import Iterable

from pydantic import Field, field_validator

from kimideploy.config.base import Name, StrictModel
from kimideploy.config.clusters import Cluster
from kimideploy.config.datasets import PublishedDataset
from kimideploy.config.drafters import (
    NO_DRAFTER,
    Drafter,
    ModelFreeMethod,
    SpeculationMethod,
    to_vllm_layer_ids,
)
from kimideploy.config.images import Image
from kimideploy.config.registry import Registry
from kimideploy.config.target import ModelVariant, TargetModel
from kimideploy.config.workload_names import GPU_WORKLOADS
from kimideploy.errors import UsageError

Path = tuple[str | int, ...]
Issue = tuple[Path, str]
"""A problem found after field validation: (path, message)."""


def release_name(project_name: str, workload: str) -> str:
    return f"{project_name}-{workload}"


class Project(StrictModel):
    """Everything kimideploy knows about one model's speculative-decoding lifecycle."""

    name: Name = Field(description="Release prefix; objects are named <name>-<workload>.")
    default_cluster: Name = Field(description="Cluster used when --cluster is not given.")
    model: TargetModel
    images: dict[Name, Image] = Field(min_length=1)
    clusters: dict[Name, Cluster] = Field(min_length=1)
    drafters: dict[Name, SpeculationMethod] = Field(default_factory=dict)
    model_variants: dict[Name, ModelVariant] = Field(
        default_factory=dict,
        description="Other checkpoints of `model` (e.g. NVFP4) that clusters may name.",
    )
    registry: Registry | None = Field(
        default=None,
        description="The OCI registry drafters and datasets are published to and pulled from.",
    )
    datasets: dict[Name, PublishedDataset] = Field(
        default_factory=dict,
        description="Conversation datasets published by `kimideploy data publish`.",
    )

    def release_name(self, workload: str) -> str:
        """The release a workload's objects belong to (serve's Deployment and records; a job run's
        objects add the run id): the one place that spelling lives."""
        return release_name(self.name, workload)

    def cluster_name(self, cluster: str | None) -> str:
        """The cluster a command works on: the one named (`--cluster`, a CLUSTER argument), else
        `default_cluster`; the one place that default is taken and an unknown name refused."""
        name = cluster or self.default_cluster
        if name not in self.clusters:
            raise UsageError(
                f"--cluster: unknown cluster '{name}' (valid: {', '.join(sorted(self.clusters))})",
                hint="clusters are defined under 'clusters:' in kimideploy.yaml",
            )
        return name

    def model_for(self, cluster: str | None) -> TargetModel:
        """The checkpoint a cluster serves: its model_variant applied to `model`, else `model`."""
        found = self.model_variants.get(self.variant_of(cluster) or "")
        return found.applied_to(self.model) if found else self.model

    def variant_of(self, cluster: str | None) -> str | None:
        return self.clusters[cluster].model_variant if cluster in self.clusters else None

    def model_repos(self) -> set[str]:
        """`model:` and its variants: a drafter trained for any of them is trained for this
        model (a variant mismatch is its own, milder finding)."""
        return {self.model.repo, *(v.repo for v in self.model_variants.values())}

    @property
    def eagle_drafters(self) -> dict[str, Drafter]:
        """The entries with weights (EAGLE-3): what is downloaded, checked, trained, published."""
        return {name: d for name, d in self.drafters.items() if isinstance(d, Drafter)}

    @property
    def model_free_methods(self) -> dict[str, ModelFreeMethod]:
        return {name: d for name, d in self.drafters.items() if not isinstance(d, Drafter)}

    def eagle_drafter(self, name: str) -> Drafter:
        """An EAGLE-3 drafter by name, for the commands only a drafter with weights has."""
        found = self.drafters.get(name)
        if isinstance(found, Drafter):
            return found
        if found is None:
            raise UsageError(
                f"unknown drafter '{name}'", hint=f"valid: {_choices(self.eagle_drafters)}"
            )
        raise UsageError(
            f"'{name}' is a model-free method ({found.method}): it has no weights to check, "
            "train, publish or pull",
            hint=f"EAGLE-3 drafters: {_choices(self.eagle_drafters)}",
        )

    @field_validator("drafters")
    @classmethod
    def _none_is_reserved(
        cls, drafters: dict[str, Drafter | ModelFreeMethod]
    ) -> dict[str, Drafter | ModelFreeMethod]:
        if NO_DRAFTER in drafters:
            raise ValueError(f"'{NO_DRAFTER}' is reserved for non-speculative serving")
        return drafters


def _choices(names: Iterable[str]) -> str:
    return ", ".join(sorted(names))


def reference_issues(project: Project) -> list[Issue]:
    """Names that point nowhere, images that cannot run on a cluster, ids out of range."""
    issues: list[Issue] = []
    if project.default_cluster not in project.clusters:
        message = f"unknown cluster '{project.default_cluster}'"
        issues.append((("default_cluster",), f"{message} (valid: {_choices(project.clusters)})"))
    for cluster_name, cluster in project.clusters.items():
        issues += _image_issues(project, cluster_name, cluster)
        issues += _cluster_issues(project, cluster_name, cluster)
    for drafter_name, drafter in project.eagle_drafters.items():
        issues += _drafter_issues(project, drafter_name, drafter)
    issues += _drafter_path_issues(project)
    issues += _variant_issues(project)
    return issues


def variant_mismatch(project: Project, drafter: Drafter, cluster: str | None) -> str | None:
    """What differs when a drafter trained on one checkpoint serves with another on `cluster`
    (the one judgement `drafter check`, `up` and the plan share); None when they agree."""
    trained, serving = drafter.lineage.trained_for_variant, project.variant_of(cluster)
    if trained == serving:
        return None

    def named(variant: str | None) -> str:
        if variant is None:
            return f"the default checkpoint ({project.model.repo})"
        found = project.model_variants.get(variant)
        return f"variant {variant} ({found.repo if found else 'undefined'})"

    return (
        f"was trained on {named(trained)} but cluster {cluster} serves {named(serving)}: "
        "its acceptance there is unmeasured (`kimideploy run bench` measures it)"
    )


def _variant_issues(project: Project) -> list[Issue]:
    issues: list[Issue] = []
    named: list[tuple[Path, str | None]] = [
        (("clusters", c, "model_variant"), cluster.model_variant)
        for c, cluster in project.clusters.items()
    ]
    named += [
        (("drafters", d, "lineage", "trained_for_variant"), drafter.lineage.trained_for_variant)
        for d, drafter in project.eagle_drafters.items()
    ]
    for where, variant in named:
        if variant is not None and variant not in project.model_variants:
            valid = _choices(project.model_variants) or "none defined under model_variants"
            issues.append((where, f"unknown model variant '{variant}' (valid: {valid})"))
    return issues


MODEL_TREE = "hub"
"""Top folder of the models volume that `host sync-model` fills (plan/inputs.target_model_path)."""
HUB_DRAFTERS = "drafters"


def _drafter_path_issues(project: Project) -> list[Issue]:
    """A drafter's folder on the models volume is written by training (an existing one is moved
    aside): it must stay inside the volume and must not be the model tree, a hub drafter's pinned
    folder, or another drafter's folder (or contain or sit inside one)."""
    issues: list[Issue] = []
    taken: dict[str, str] = {}
    for name, drafter in project.eagle_drafters.items():
        if drafter.source.hub is not None:
            hub = drafter.source.hub
            taken[f"{HUB_DRAFTERS}/{hub.repo}/{hub.revision}"] = f"hub drafter {name}"
    for name, drafter in sorted(project.eagle_drafters.items()):
        raw = drafter.source.path
        if raw is None:
            continue
        where: Path = ("drafters", name, "source", "path")
        parts = raw.split("/")
        if any(part in ("", ".", "..") for part in parts):
            issues.append((where, f"'{raw}' must be a plain relative folder (no '.', '..' or //)"))
            continue
        if parts[0] == MODEL_TREE:
            issues.append(
                (
                    where,
                    f"'{raw}' is inside the model tree ({MODEL_TREE}/), which "
                    "training would move aside",
                )
            )
            continue
        for other, owner in taken.items():
            if raw == other or raw.startswith(other + "/") or other.startswith(raw + "/"):
                issues.append((where, f"'{raw}' overlaps the folder of {owner} ({other})"))
                break
        taken[raw] = f"drafter {name}"
    return issues


def _image_issues(project: Project, name: str, cluster: Cluster) -> list[Issue]:
    issues: list[Issue] = []
    for workload, image_name in cluster.images.model_dump(exclude_none=True).items():
        path: Path = ("clusters", name, "images", workload)
        image = project.images.get(image_name)
        if image is None:
            valid = _choices(project.images)
            issues.append((path, f"unknown image '{image_name}' (valid: {valid})"))
            continue
        if workload in GPU_WORKLOADS and cluster.gpu.arch not in image.cuda_archs:
            built = ", ".join(image.cuda_archs) or "no GPU"
            message = f"image '{image_name}' is built for {built}, not {cluster.gpu.arch}"
            issues.append((path, f"{message} ({cluster.gpu.product})"))
        if workload == "serve" and image.vllm is None:
            issues.append((path, f"image '{image_name}' has no vLLM; serve needs one"))
    return issues


def _cluster_issues(project: Project, name: str, cluster: Cluster) -> list[Issue]:
    issues: list[Issue] = []
    train_path: Path = ("clusters", name, "workloads", "train")
    train = cluster.workloads.train
    for field, drafter_name in (("drafter", train.drafter), ("base_drafter", train.base_drafter)):
        if drafter_name is not None and drafter_name not in project.eagle_drafters:
            valid = _choices(project.eagle_drafters)
            found = project.drafters.get(drafter_name)
            message = (
                f"unknown drafter '{drafter_name}' (valid: {valid})"
                if found is None
                else f"'{drafter_name}' is a model-free method ({found.method}): only an EAGLE-3 "
                f"drafter is trained (valid: {valid})"
            )
            issues.append(((*train_path, field), message))
    if train.conversations is not None and train.conversations not in project.datasets:
        valid = _choices(project.datasets) or "none published yet"
        message = f"unknown dataset '{train.conversations}' (valid: {valid})"
        issues.append(((*train_path, "conversations"), message))
    if train.conversations is not None and project.registry is None:
        message = "a published dataset is pulled from the registry, but no `registry:` is set"
        issues.append(((*train_path, "conversations"), message))
    trained = project.eagle_drafters.get(train.drafter)
    if trained is not None and trained.source.path is None:
        message = (
            f"drafter '{train.drafter}' has no source.path; training writes its output to the "
            "models volume, so give the drafter one"
        )
        issues.append(((*train_path, "drafter"), message))
    if train.nodes > cluster.nodes:
        message = f"{train.nodes} nodes requested but the cluster has {cluster.nodes}"
        issues.append(((*train_path, "nodes"), message))
    copies = cluster.workloads.serve.replicas + 1
    if cluster.rollout == "rolling" and cluster.total_gpus < copies * cluster.gpu.per_node:
        message = (
            f"a rolling update needs room for {copies} copies of {cluster.gpu.per_node} GPUs; "
            f"the cluster has {cluster.total_gpus} (use recreate or auto)"
        )
        issues.append((("clusters", name, "rollout"), message))
    if cluster.workloads.extract.gpus_per_shard > cluster.gpu.per_node:
        message = f"a node has only {cluster.gpu.per_node} GPUs"
        issues.append((("clusters", name, "workloads", "extract", "gpus_per_shard"), message))
    usable = cluster.gpu.per_node * cluster.gpu.memory_gb * 0.9
    weights = project.model_for(name).weights_gb
    if weights > usable:
        message = (
            f"{weights:g} GB of weights do not fit on one node "
            f"({cluster.gpu.per_node} x {cluster.gpu.memory_gb:g} GB, 90% usable)"
        )
        issues.append((("clusters", name, "gpu"), message))
    return issues


def _drafter_issues(project: Project, name: str, drafter: Drafter) -> list[Issue]:
    issues: list[Issue] = []
    path: Path = ("drafters", name)
    layers = project.model.num_hidden_layers
    convention = drafter.layer_id_convention
    vllm_ids = to_vllm_layer_ids(drafter.aux_layer_ids, convention)
    # vLLM id k is the residual entering layer k, so 1..n-1 are the inner layers' outputs.
    low, high = (1, layers - 1) if convention == "vllm" else (0, layers - 2)
    for index, (written, vllm_id) in enumerate(zip(drafter.aux_layer_ids, vllm_ids, strict=True)):
        if not 1 <= vllm_id <= layers - 1:
            message = (
                f"{written} is out of range for a {layers}-layer target in the {convention} "
                f"convention ({low}..{high})"
            )
            issues.append(((*path, "aux_layer_ids", index), message))
    if len(set(vllm_ids)) != len(vllm_ids):
        issues.append(((*path, "aux_layer_ids"), "layer ids must be distinct"))
    if drafter.draft_vocab_size > project.model.vocab_size:
        message = f"must not exceed the target vocabulary ({project.model.vocab_size})"
        issues.append(((*path, "draft_vocab_size"), message))
    base = drafter.lineage.base_drafter
    if base and base not in project.eagle_drafters:
        message = f"unknown EAGLE-3 drafter '{base}' (valid: {_choices(project.eagle_drafters)})"
        issues.append(((*path, "lineage", "base_drafter"), message))
    return issues
