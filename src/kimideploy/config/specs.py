"""Workload specs: what each in-container entrypoint reads from /etc/kimideploy/spec.json.

The renderer writes these and the workloads read them with the same models. Unlike the user's
config they ignore unknown keys, so a pod running an older image accepts a spec from a newer CLI.
"""

from enum import IntEnum
from pathlib import PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kimideploy.config.drafters import LayerConvention

SPEC_MOUNT_DIR = "/etc/kimideploy"
SPEC_FILE_NAME = "spec.json"
SPEC_PATH = f"{SPEC_MOUNT_DIR}/{SPEC_FILE_NAME}"
API_KEY_ENV = "KIMIDEPLOY_API_KEY"


class WorkloadExit(IntEnum):
    """How a workload process ends; the Job's podFailurePolicy (plan/jobs.py) acts on these."""

    OK = 0
    FAILED = 1
    BAD_INPUT = 2  # the spec, data or credentials cannot be used: a retry fails the same way
    INTERRUPTED = 75  # EX_TEMPFAIL: drained on SIGTERM after a checkpoint; resumable


"""Where bench and datagen pods find the serve release's API key (from its Secret), if any."""


class SpecModel(BaseModel):
    # defer_build: as config/base.py's StrictModel; a render builds only its own workload's spec.
    model_config = ConfigDict(extra="ignore", frozen=True, defer_build=True)


class TargetRef(SpecModel):
    repo: str
    revision: str
    served_name: str
    path: str = Field(description="Weights directory inside the pod.")
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int


class LayerSelection(SpecModel):
    """Aux layer ids with the convention they are written in (docs/reference/domain.md §4)."""

    ids: list[int]
    convention: LayerConvention
    vllm_ids: list[int] = Field(description="The same layers in vLLM's convention.")


REGISTRY_MOUNT = "/var/run/secrets/kimideploy/registry"


class RegistryAccess(SpecModel):
    """How a pod reaches the registry: Docker's credential file (a mounted dockerconfigjson
    Secret), an optional CA, plain HTTP."""

    config: str = f"{REGISTRY_MOUNT}/.dockerconfigjson"
    ca_file: str | None = None
    plain_http: bool = False


class PulledArtifact(SpecModel):
    """A published artifact a pod's artifact-pull init container fetches into a volume before
    anything reads it (idempotent by digest)."""

    kind: Literal["drafter", "conversations"]
    name: str
    reference: str = Field(description="repository@sha256:...")
    dest: str
    files: dict[str, str] = Field(default_factory=dict, description="File -> sha256.")
    registry: RegistryAccess = Field(default_factory=RegistryAccess)
    fingerprint: str | None = Field(
        default=None, description="conversations: the id its fingerprint.json must carry."
    )


class WorkloadSpec(SpecModel):
    workload: str
    run_id: str
    cluster: str
    shards: int = 1
    target: TargetRef
    pulls: list[PulledArtifact] = Field(
        default_factory=list,
        description="Published drafters and datasets the pod pulls first (artifact-pull).",
    )

    def written_folders(self) -> list[str]:
        """The folders this workload creates files in; each is probed for writing when the pod
        starts, so a folder the pod's user cannot write fails in seconds, not after hours."""
        return []


class DatagenSpec(WorkloadSpec):
    workload: Literal["datagen"] = "datagen"
    prompts: str
    output_dir: str
    samples: int
    endpoint: str
    concurrency: int
    max_tokens: int
    temperature: float
    top_p: float
    request_timeout_s: int
    max_retries: int
    token_timeout_s: int = 120
    max_failed_share: float = 0.01
    chunk_samples: int = 64
    fingerprint: dict[str, Any] = Field(
        default_factory=dict, description="What makes this dataset (config.fingerprints)."
    )

    def written_folders(self) -> list[str]:
        return [self.output_dir]


class ExtractSpec(WorkloadSpec):
    workload: Literal["extract"] = "extract"
    conversations_dir: str
    output_dir: str
    layers: LayerSelection
    dtype: str
    backend: str
    tensor_parallel_size: int
    expected_bytes: int
    fingerprint: dict[str, Any] = Field(default_factory=dict)
    max_model_len: int = Field(
        default=1_048_576,
        description="The model's context limit: the engine is sized for the longest sample, and a "
        "sample longer than this is refused before the engine loads.",
    )
    gpu_memory_utilization: float = 0.9
    max_num_batched_tokens: int = 16384
    scratch_dir: str | None = Field(
        default=None,
        description="Pod-local folder the engine's connector writes to; default: inside the "
        "output folder (the shared volume).",
    )

    def written_folders(self) -> list[str]:
        return [self.output_dir, *([self.scratch_dir] if self.scratch_dir else [])]


class VocabSpec(WorkloadSpec):
    workload: Literal["vocab"] = "vocab"
    conversations_dir: str
    output_dir: str
    draft_vocab_size: int
    fingerprint: dict[str, Any] = Field(default_factory=dict)

    def written_folders(self) -> list[str]:
        return [self.output_dir]


class OnlineTrainSpec(SpecModel):
    """train.mode online: where the target server beside the trainer answers, and how to ask it."""

    endpoint: str = Field(description="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1.")
    storage_dir: str = Field(description="The connector's shared_storage_path, as mounted here.")
    conversations_dir: str
    aux_layer_ids: list[int] = Field(description="What the server was started with (vLLM ids).")
    request_timeout_s: int = 600
    max_retries: int = 5
    server_wait_s: int = Field(
        default=2700, description="How long to wait for a (re)loading server."
    )
    concurrency: int = Field(default=8, description="Requests in flight per rank (prefetch).")


class NetworkCheck(SpecModel):
    """The all-reduce across a multi-node training Job's ranks before its first step."""

    min_bus_gbps: float | None = None
    bytes: int = 256 * 2**20


class TrainSpec(WorkloadSpec):
    workload: Literal["train"] = "train"
    drafter: str
    base_drafter_path: str | None
    hidden_states_dir: str
    vocab_dir: str
    checkpoint_dir: str
    output_dir: str
    layers: LayerSelection
    draft_vocab_size: int
    num_speculative_tokens: int
    mode: str
    nodes: int
    gpus_per_node: int
    epochs: int
    lr: float
    batch_size: int
    max_seq_len: int
    checkpoint_every_steps: int
    draft_layers: int = 1
    convert_layer_convention: bool = False
    data_fingerprint: dict[str, Any] = Field(
        default_factory=dict,
        description="The fingerprint of what training reads: the features (offline) or the "
        "conversations (online); the recorded one must match.",
    )
    seed: int = 0
    precision: Literal["bf16", "fp32"] = "bf16"
    loss_implementation: Literal["eager", "fused"] = "eager"
    loader_workers: int = 0
    resume_dir: str | None = None
    online: OnlineTrainSpec | None = None
    network_check: NetworkCheck | None = None
    ttt_steps: int = 3
    ttt_step_loss_decay: float = 1.0
    anchor_weight: float = Field(
        default=0.0,
        description="With a base drafter: the weight of the pull toward its weights (the sum of "
        "squared differences, L2-SP), so a fine-tune on a narrow dataset does not forget.",
    )
    lr_schedule: Literal["cosine", "linear", "constant"] = "constant"
    warmup_ratio: float = 0.0
    min_lr_ratio: float = 1.0
    weight_decay: float = 0.01
    held_out_fraction: float = 0.0
    held_out_max_samples: int = 256
    conversations_dir: str | None = Field(
        default=None,
        description="The conversations the features were made from: the judged held-out ones "
        "travel with the drafter (its replay sample, read by `drafter doctor`).",
    )

    @property
    def judged_depth(self) -> int:
        """Held-out acceptance is measured up to the deeper of training and serving."""
        return max(self.ttt_steps, self.num_speculative_tokens)

    def written_folders(self) -> list[str]:
        """The drafter is written beside its folder and renamed into place (the folder itself
        must not exist early: an existing one is moved aside as the previous drafter)."""
        return [str(PurePosixPath(self.output_dir).parent), self.checkpoint_dir]


SYNTHETIC_CONTROL_EXTENSION = "kimideploy.workloads.synthetic_acceptance.SyntheticAcceptanceControl"
"""The vLLM worker extension a calibration revision serves with (`--worker-extension-cls`)."""
SYNTHETIC_CONTROL_METHOD = "kimideploy_set_synthetic_acceptance"
"""Its method, which the bench calls through `/collective_rpc`."""


class SyntheticSweep(SpecModel):
    """`run calibrate`: the bench measures every level at each synthetic acceptance length,
    setting it through the calibration revision's control endpoint before each pass."""

    num_speculative_tokens: int
    acceptance_lengths: list[float]
    control_url: str
    reset_prefix_cache_url: str


class BenchSpec(WorkloadSpec):
    workload: Literal["bench"] = "bench"
    endpoint: str
    metrics_url: str
    drafter: str
    prompt_sets: list[str]
    prompt_files: dict[str, str] = Field(
        default_factory=dict, description="Prompt set name -> file inside the pod."
    )
    concurrency: list[int]
    num_prompts: int
    max_tokens: int
    results_dir: str
    baseline_path: str | None = None
    synthetic: SyntheticSweep | None = None
    kernels: str | None = Field(
        default=None,
        description="The kernels that serve what is measured (the serve image's kernel plan on "
        "the cluster's GPU: attention, the experts' kernel, the drafter's), kept with every "
        "figure so that two results on different kernels are not read as one stack.",
    )


class PullSpec(WorkloadSpec):
    """`drafter pull` / `host sync-model`: the published drafters in `pulls`, fetched onto the
    models volume by the same artifact-pull the serve pod runs first (which then finds them there,
    same digest, and fetches nothing)."""

    workload: Literal["pull"] = "pull"


class WeightsTarget(SpecModel):
    repo: str
    revision: str
    dest: str = Field(description="The folder on the models volume, as the pods mount it.")


class WeightsSpec(WorkloadSpec):
    """`host sync-model` on a cluster with a shared models claim: each target downloaded into
    the claim by the same resumable, verified downloader the SSH path runs on a host."""

    workload: Literal["weights"] = "weights"
    targets: list[WeightsTarget]
    endpoint: str
    streams: int = 16
    token_file: str | None = Field(
        default=None, description="The hub token (a mounted Secret), read once, sent on stdin."
    )

    def written_folders(self) -> list[str]:
        return [t.dest for t in self.targets]


class PublishSpec(WorkloadSpec):
    """`drafter publish` / `data publish`: a folder on a volume pushed as one OCI artifact."""

    workload: Literal["publish"] = "publish"
    kind: Literal["drafter", "conversations"]
    name: str
    source_dir: str
    repository: str
    tag: str
    annotations: dict[str, str] = Field(default_factory=dict)
    registry: RegistryAccess = Field(default_factory=RegistryAccess)


class CaptureSpec(SpecModel):
    """The serve pod's capture sidecar (workloads/capture_proxy.py): where it listens and writes,
    and the operator's retention and identity rules (serve.capture)."""

    directory: str = Field(description="This release's capture folder on the datasets volume.")
    listen_port: int = Field(description="The API port the sidecar takes.")
    engine_port: int = Field(description="vLLM's port on the pod's loopback.")
    retention_days: int
    max_prompts_per_day: int
    sample_rate: float
    keep_request_fields: list[str] = []


class ServeSpec(WorkloadSpec):
    """Read by the serve pod's start-up GPU check and by `drafter check`."""

    workload: Literal["serve"] = "serve"
    drafter: str
    drafter_path: str | None
    layers: LayerSelection | None
    num_speculative_tokens: int | None
    draft_vocab_size: int | None = None
    decoder: Literal["llama", "mla"] = "llama"
    image_patches: list[str] = []
    image_cuda_archs: list[str]
    vllm_version: str | None
    speculation: bool = Field(
        default=True,
        description="False: this revision serves without speculation from a server that keeps "
        "its drafter loaded; the keeper switches speculation off in the running engine.",
    )
    drafter_sha256: dict[str, str] = Field(
        default_factory=dict,
        description="The drafter's config.json and safetensors files by sha256, where the project "
        "knows them (a published drafter's files, a drafter's `sha256`): the keeper and the "
        "engine swap in only files that match.",
    )
    capture: CaptureSpec | None = Field(
        default=None,
        # Left out when unset: a spec without it hashes as before, so no running release rolls
        # (a 25-minute reload) for a key it does not use.
        exclude_if=lambda value: value is None,
        description="Served prompts recorded (serve.capture); None: not recorded.",
    )

    def written_folders(self) -> list[str]:
        return [self.capture.directory] if self.capture is not None else []


class ReplayDrafter(SpecModel):
    """One drafter a replay judges, as the cluster would serve it."""

    name: str
    path: str = Field(description="The drafter's folder inside the pod.")
    served_layer_ids: list[int] = Field(description="What serving feeds it (vLLM ids).")
    num_speculative_tokens: int


class ReplayPromptSet(SpecModel):
    """Prompts the served engine answers in the replay: the user's (`--prompts`, `--replay`)."""

    name: str
    rows: list[dict[str, Any]] = Field(
        description="JSON Lines rows as the bench reads them: {id, prompt} or {id, messages}."
    )


class ReplaySpec(WorkloadSpec):
    """`drafter doctor` / `drafter check --replay`: the serving engine captures hidden states of
    conversations as they are served (replay-capture), then the drafters are judged offline on
    them with training's held-out computation (replay-judge)."""

    workload: Literal["replay"] = "replay"
    capture_dir: str = Field(description="Captured sequences, shared by every replay of them.")
    capture_image: str = Field(description="The image whose vLLM captures (for the record).")
    capture_note: str = ""
    layer_ids: list[int] = Field(description="vLLM ids captured; the final layer is added.")
    drafters: list[ReplayDrafter]
    prompt_sets: list[ReplayPromptSet] = Field(default_factory=list)
    max_tokens: int = 128
    dtype: str = "bfloat16"
    tensor_parallel_size: int = 1
    batch_size: int = 8
    max_seq_len: int = 4096
    gpu_memory_utilization: float = 0.9
    max_num_batched_tokens: int = 16384

    def written_folders(self) -> list[str]:
        return [self.capture_dir]


SPEC_TYPES: dict[str, type[WorkloadSpec]] = {
    spec.model_fields["workload"].default: spec for spec in WorkloadSpec.__subclasses__()
}
"""Each workload's spec model, by the name its `workload` field carries."""
