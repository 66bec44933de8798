"""Per-cluster sizes and settings of each workload."""

from typing import Annotated, Literal, Self

from pydantic import Field, field_validator, model_validator

from kimideploy.config.base import LabelValue, Name, Port, QualifiedName, Quantity, StrictModel
from kimideploy.config.target import SecretRef


class PodResources(StrictModel):
    cpu: Quantity
    """CPU request and limit (a Kubernetes quantity)."""
    memory: Quantity
    """Memory request and limit (a Kubernetes quantity)."""


class WorkloadSettings(StrictModel):
    """Settings every workload has."""

    resources: PodResources
    """CPU and memory of each pod of the workload."""
    pod_annotations: dict[QualifiedName, str] = Field(
        default_factory=dict, description="Extra pod annotations (scrape configs, meshes, tests)."
    )


class GrafanaDashboard(StrictModel):
    """A ConfigMap per serve release holding its dashboard, labelled for Grafana's dashboard
    sidecar (kube-prometheus-stack: sidecar.dashboards.label / labelValue)."""

    enabled: bool = True
    """Ship the dashboard ConfigMap with the serve release."""
    label: QualifiedName = "grafana_dashboard"
    """The label Grafana's dashboard sidecar selects ConfigMaps by."""
    label_value: LabelValue = "1"
    """That label's value."""


class LoadSettings(StrictModel):
    """How vLLM reads the target's weights at start-up, and whether a restart finds them in the
    page cache (plan/page_cache.py decides what `auto` means on each cluster and says why)."""

    strategy: Literal["auto", "lazy", "eager", "prefetch"] = Field(
        default="auto",
        description="vLLM's --safetensors-load-strategy. auto: prefetch (every rank reads its "
        "share of the files into the page cache with several threads, then maps them) where the "
        "page cache can hold the checkpoint, else lazy (mapped and read on demand; eager reads "
        "whole files into each rank's memory: 8 copies of 595 GB).",
    )
    prefetch_threads: Annotated[int, Field(ge=1, le=128)] | None = Field(
        default=None,
        description="vLLM's --safetensors-prefetch-num-threads per rank with prefetch. Unset: "
        "16 on a shared filesystem (latency-bound reads), 4 on local storage (8 ranks x 4 "
        "readers saturate an NVMe drive).",
    )
    page_cache: Literal["auto", "raise-limit", "warmer", "off"] = Field(
        default="auto",
        description="Keep the checkpoint in the page cache across restarts. auto: raise the "
        "serve container's memory limit to hold it where the node has the RAM; warmer: keep the "
        "limit and read the checkpoint into the page cache from a Job of its own on the serving "
        "node before the serve pod starts; off: leave the limit as it is (a restart reads the "
        "storage again). Needs clusters.<c>.node_memory_gb.",
    )
    local_copy: Literal["auto", "always", "never"] = Field(
        default="auto",
        description="Serve the target from a copy on each node's local NVMe "
        "(storage.node_local) instead of the shared models claim. auto: when the models "
        "claim's measured read bandwidth is below min_read_gbps; always; never.",
    )
    min_read_gbps: Annotated[float, Field(gt=0, le=1000)] = Field(
        default=2.0,
        description="With local_copy auto: the shared filesystem's read bandwidth (GB/s, "
        "measured by the storage probe) below which the weights are copied to node-local NVMe "
        "once (595 GB at 2 GB/s is about 5 minutes a load).",
    )


FORBIDDEN_CAPTURE_FIELDS = frozenset({"user", "safety_identifier", "prompt_cache_key"})
"""Request fields that identify a person or a session: never recorded, whatever is allowed."""


class CaptureSettings(StrictModel):
    """Served prompts recorded for `drafter refresh`, with each request's own acceptance. Off
    unless this block is set. A sidecar in each serve pod takes the API port and passes every
    request through to vLLM unchanged (vLLM then listens on `engine_port`, on the pod's loopback
    only); what it records is the conversation (each message's role and content), the answer
    length asked, the fields listed in `keep_request_fields`, the UTC day, and the response's
    acceptance. Never a header, an address, a request id, a message's `name`, or a user id."""

    path: Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$")] = Field(
        default="capture",
        description="Folder on the datasets volume; each release writes under <path>/<release>/, "
        "one file per UTC day.",
    )
    retention_days: Annotated[int, Field(ge=1, le=365)] = Field(
        default=14,
        description="Days a captured prompt is kept: older days' files are deleted by the sidecar "
        "(at start and at each new day).",
    )
    max_prompts_per_day: Annotated[int, Field(ge=1, le=10_000_000)] = Field(
        default=20_000,
        description="Requests recorded per UTC day at most; the rest pass unrecorded.",
    )
    sample_rate: Annotated[float, Field(gt=0, le=1)] = Field(
        default=1.0, description="Share of requests recorded (each drawn independently)."
    )
    keep_request_fields: list[Annotated[str, Field(pattern=r"^[a-z_]+$")]] = Field(
        default_factory=list,
        description="Top-level request fields recorded beside the messages (e.g. tools, "
        "metadata). user, safety_identifier and prompt_cache_key are refused: they identify a "
        "person or a session.",
    )
    engine_port: Port = Field(
        default=8001,
        description="Where vLLM listens inside the pod while the sidecar serves the port.",
    )

    @field_validator("keep_request_fields")
    @classmethod
    def _no_identities(cls, fields: list[str]) -> list[str]:
        named = sorted(FORBIDDEN_CAPTURE_FIELDS & set(fields))
        if named:
            verb = "identifies" if len(named) == 1 else "identify"
            raise ValueError(
                f"{', '.join(named)} {verb} a person or a session and is never recorded"
            )
        return fields


class ServeSettings(WorkloadSettings):
    replicas: Annotated[int, Field(ge=1, le=64)] = 1
    """Serve pods (each holds the whole model)."""
    shm_size: Quantity = Field(default="64Gi", description="Memory-backed /dev/shm for NCCL.")
    port: Port = 8000
    """The API port of the serve pods."""
    startup_budget_s: Annotated[int, Field(ge=600, le=21600)] = Field(
        default=2700, description="Time a replica may take to load weights (>= 40 min for 1T)."
    )
    probe_period_s: Annotated[int, Field(ge=1, le=300)] = 10
    """Seconds between startup and readiness probes."""
    gpu_memory_utilization: Annotated[float, Field(gt=0.1, le=0.99)] = 0.92
    """vLLM's --gpu-memory-utilization."""
    max_num_seqs: Annotated[int, Field(ge=1, le=4096)] = 128
    """vLLM's --max-num-seqs: the most requests in one batch."""
    kv_cache_dtype: Literal["auto", "fp8"] = Field(
        default="auto",
        description="vLLM's --kv-cache-dtype: auto stores the KV cache in the model's dtype "
        "(bf16), fp8 in half the bytes (twice the tokens per GPU).",
    )
    max_num_batched_tokens: Annotated[int, Field(ge=256, le=1_048_576)] | None = Field(
        default=None,
        description="vLLM's --max-num-batched-tokens: the token budget of one engine step "
        "(prefill chunks and decodes together); larger favours throughput and TTFT of long "
        "prompts, smaller the decode latency of the others. Unset: vLLM's default.",
    )
    mm_encoder_tp_mode: Literal["data", "weights"] = Field(
        default="data",
        description="vLLM's --mm-encoder-tp-mode for a multimodal target (Kimi-K2.5's vision "
        "tower): data runs a copy of the small encoder per GPU on its share of the images (the "
        "recipe's choice), weights shards it across the tensor-parallel GPUs like the LLM. Not "
        "passed for a text-only target.",
    )
    moe_backend: Literal[
        "auto", "marlin", "triton", "humming", "cutlass", "flashinfer_trtllm", "flashinfer_cutlass"
    ] = Field(
        default="auto",
        description="vLLM's --moe-backend: the routed experts' kernel. auto: vLLM's oracle (for "
        "Kimi-K2.5's INT4 experts, Marlin on every cluster; the kernel plan says what it picks). "
        "flashinfer_trtllm runs INT4 experts on FlashInfer's TRT-LLM kernel on the sm_100 family "
        "only (the plan then sets VLLM_USE_FLASHINFER_MOE_INT4=1, which that kernel needs).",
    )
    attention_backend: Annotated[str, Field(pattern=r"^[A-Z0-9_]+$")] | None = Field(
        default=None,
        description="vLLM's --attention-backend, pinned instead of chosen at start-up (the "
        "kernel plan shows what the image's vLLM would choose on this cluster's GPU).",
    )
    extra_args: list[str] = Field(
        default_factory=list,
        description="Extra vLLM flags, appended verbatim (checked by image verify).",
    )
    # Not on/off: YAML 1.1 reads those as booleans, in the config file and in --set alike.
    pod_monitor: Literal["auto", "always", "never"] = Field(
        default="auto",
        description="A Prometheus Operator PodMonitor for the serve pods. auto: rendered by `up` "
        "when the cluster serves monitoring.coreos.com/v1 podmonitors.",
    )
    scrape_interval_s: Annotated[int, Field(ge=5, le=600)] = 15
    """The PodMonitor's scrape interval."""
    grafana_dashboard: GrafanaDashboard = Field(
        default_factory=lambda: GrafanaDashboard(),
        description="The release's Grafana dashboard as a ConfigMap for Grafana's sidecar.",
    )
    per_request_spec_metrics: bool = Field(
        default=True,
        description="Where the image's vLLM has them (>= 0.32), per-request acceptance in each "
        "response (--per-request-spec-decode-metrics summary): the bench and the gate then count "
        "only their own requests, not other traffic on the release.",
    )
    load: LoadSettings = Field(default_factory=LoadSettings)
    """How the target's weights are read at start-up (the loader, the page cache, a local
    copy)."""
    drafter_swap: bool = Field(
        default=True,
        description="Where the image's vLLM can (>= 0.32), serve a drafter so that `up serve "
        "--drafter` replaces it in the running server (seconds) instead of reloading the target "
        "(vLLM's development mode, its routes kept to the pod by kimideploy's guard).",
    )
    api_key: SecretRef | None = Field(
        default=None,
        description="A Secret key holding the API key vLLM requires on /v1 (VLLM_API_KEY); the "
        "bench and datagen pods that call this release send it. /health and /metrics stay open.",
    )
    capture: CaptureSettings | None = Field(
        default=None,
        description="Record served prompts with their acceptance for `drafter refresh` (off "
        "unless set; see its keys for what is and is never kept).",
    )

    @model_validator(mode="after")
    def _capture_counts_per_request(self) -> Self:
        if self.capture is not None and not self.per_request_spec_metrics:
            raise ValueError(
                "capture records each request's own acceptance, which needs "
                "per_request_spec_metrics: true"
            )
        if self.capture is not None and self.capture.engine_port == self.port:
            raise ValueError("capture.engine_port must differ from port (the sidecar takes port)")
        return self


class DatagenSettings(WorkloadSettings):
    prompts: str = Field(
        description="Prompt dataset path on the datasets volume (.jsonl or .parquet)."
    )
    samples: Annotated[int, Field(ge=1, le=100_000_000)]
    """Conversations to generate."""
    shards: Annotated[int, Field(ge=1, le=1024)]
    """Job indexes the prompts are split over (each writes its own shard)."""
    concurrency: Annotated[int, Field(ge=1, le=4096)] | None = Field(
        default=None,
        description="In-flight requests per shard. Unset: what the serve release can hold at "
        "once shared over the shards (serve.replicas x serve.max_num_seqs / shards); more is "
        "refused, since requests beyond it only wait in vLLM's queue and time out.",
    )
    max_tokens: Annotated[int, Field(ge=1, le=262_144)] = 8192
    """Output tokens per generated answer."""
    temperature: Annotated[float, Field(ge=0, le=2)] = 0.6
    """Sampling temperature of the answers."""
    top_p: Annotated[float, Field(gt=0, le=1)] = 0.95
    """Top-p of the answers."""
    request_timeout_s: Annotated[int, Field(ge=1, le=86_400)] = Field(
        default=3600,
        description="Seconds a request may wait for its first token: queued behind the other "
        "requests and prefilled. After the first token, token_timeout_s applies.",
    )
    token_timeout_s: Annotated[int, Field(ge=1, le=7200)] = Field(
        default=120,
        description="The longest silence between two streamed chunks once the answer has "
        "started: a stalled stream fails and is retried, a long answer does not.",
    )
    max_retries: Annotated[int, Field(ge=0, le=20)] = 5
    """Retries of one request before the sample is recorded as failed."""
    max_failed_share: Annotated[float, Field(ge=0, le=1)] = Field(
        default=0.01,
        description="The share of a shard's prompts that may fail (after their retries) before "
        "the shard fails instead of finishing with a silently smaller dataset.",
    )
    chunk_samples: Annotated[int, Field(ge=1, le=100_000)] = Field(
        default=64, description="Samples per output chunk: what a restart can lose at most."
    )
    expected_tokens_per_sample: Annotated[int, Field(ge=1, le=1_000_000)] = Field(
        default=1450, description="Planning figure for storage (828 GB / 10K samples last time)."
    )
    endpoint: str = Field(
        default="serve",
        description="'serve' for the non-speculative serve release, or an http(s) base URL.",
    )

    @property
    def asks_the_serve_release(self) -> bool:
        """Its endpoint is this project's serve release (sized, keyed and reached by kimideploy)."""
        return self.endpoint == "serve"


class ExtractSettings(WorkloadSettings):
    shards: Annotated[int, Field(ge=1, le=1024)]
    """Job indexes the conversations are split over."""
    gpus_per_shard: Annotated[int, Field(ge=1, le=16)] = Field(
        default=8, description="GPUs per extraction pod; the target must fit on them."
    )
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    """dtype the hidden states are stored in."""
    backend: Literal["vllm", "transformers"] = Field(
        default="vllm", description="vllm: production path; transformers: reference path."
    )
    gpu_memory_utilization: Annotated[float, Field(gt=0.1, le=0.98)] = Field(
        default=0.9,
        description="vLLM's gpu_memory_utilization for the extraction engine (and the replay's "
        "capture engine). The engine's max_model_len is the longest sample's length, not the "
        "model's own context.",
    )
    max_num_batched_tokens: Annotated[int, Field(ge=256, le=1_048_576)] = Field(
        default=16384,
        description="Tokens per engine step: extraction is prefill only, so one step takes many "
        "samples' prefills (vLLM's serving default is tuned for decode).",
    )
    scratch_size: Quantity = Field(
        default="64Gi",
        description="Pod-local emptyDir the engine's connector writes each request's hidden "
        "states to (two batches in flight; read, converted and deleted while the next batch "
        "prefills), so only the converted sample crosses the network filesystem, once. Put the "
        "kubelet's root directory on the node's NVMe.",
    )


class VocabSettings(WorkloadSettings):
    """Vocab mapping runs on CPU; only resources and annotations are set."""


def _server_resources() -> PodResources:
    return PodResources(cpu="32", memory="256Gi")


class OnlineTrainSettings(StrictModel):
    """train.mode: online. Each trainer pod runs the target in a vLLM server beside it (a native
    sidecar on GPUs of the same node); hidden states go through a pod-local scratch directory and
    are deleted once read, so nothing is stored (300K samples stored would be ~25 TB;
    docs/reference/domain.md §5)."""

    server_gpus: Annotated[int, Field(ge=1, le=16)] | None = Field(
        default=None,
        description="GPUs per node for the target server (its tensor parallel size); the "
        "trainer gets the others. Default: the fewest of 1, 2, 4, 8 that hold the weights plus "
        "kv_headroom_gb per GPU.",
    )
    gpu_memory_utilization: Annotated[float, Field(gt=0.1, le=0.98)] = 0.9
    """vLLM's --gpu-memory-utilization for the target server beside the trainer."""
    kv_headroom_gb: Annotated[float, Field(ge=1, le=1000)] = Field(
        default=8,
        description="Per server GPU beyond its share of the weights: KV cache, the "
        "hidden-state buffer and activations of one prefill.",
    )
    server_resources: PodResources = Field(default_factory=_server_resources)
    """CPU and memory of the target server container."""
    startup_budget_s: Annotated[int, Field(ge=600, le=21600)] = Field(
        default=2700, description="Time the server may take to load the weights."
    )
    port: Port = 8000
    """Port of the target server inside the training pod."""
    request_timeout_s: Annotated[int, Field(ge=10, le=7200)] = 600
    """Seconds one hidden-state request may take."""
    max_retries: Annotated[int, Field(ge=0, le=20)] = 5
    """Retries of one hidden-state request before training fails."""
    concurrency: Annotated[int, Field(ge=1, le=256)] = Field(
        default=8, description="Samples requested ahead per trainer rank."
    )
    scratch_size: Quantity = Field(
        default="256Gi",
        description="Pod-local emptyDir the server writes hidden states to (deleted once read).",
    )


class TrainSettings(WorkloadSettings):
    drafter: Name = Field(description="Drafter record this run produces (its layer ids and vocab).")
    base_drafter: Name | None = Field(default=None, description="Drafter to fine-tune from.")
    anchor_weight: Annotated[float, Field(ge=0, le=100)] = Field(
        default=0.0,
        description="With base_drafter: the weight of a pull toward its weights (the sum of "
        "squared differences, added to the loss: L2-SP), so a fine-tune on a narrow dataset, "
        "such as a refresh from captured traffic, does not forget what the base drafter knew. "
        "0: a plain fine-tune.",
    )
    conversations: Name | None = Field(
        default=None,
        description="A published dataset (datasets.<name>) this pipeline extracts and trains "
        "from, pulled by digest into this cluster's datasets volume, instead of the "
        "conversations this cluster's datagen would make.",
    )
    mode: Literal["offline", "online"] = Field(
        default="offline", description="offline: stored hidden states; online: computed live."
    )
    nodes: Annotated[int, Field(ge=1, le=128)] = 1
    """Nodes the training Job spans (one launcher and its ranks per node)."""
    epochs: Annotated[int, Field(ge=1, le=100)] = 5
    """Passes over the training samples."""
    lr: Annotated[float, Field(gt=0, le=1)] = 1e-4
    """Peak learning rate (after warmup)."""
    batch_size: Annotated[int, Field(ge=1, le=4096)] = Field(default=8, description="Per GPU.")
    max_seq_len: Annotated[int, Field(ge=128, le=262_144)] = 8192
    """Tokens per training sequence; longer conversations are cut."""
    checkpoint_every_steps: Annotated[int, Field(ge=1, le=1_000_000)] = 1000
    """Steps between checkpoints (each is judged on held-out data and can be resumed from)."""
    draft_layers: Annotated[int, Field(ge=1, le=8)] = Field(
        default=1, description="Decoder layers of a drafter trained from scratch (EAGLE-3: 1)."
    )
    convert_layer_convention: bool = Field(
        default=False,
        description="Accept a dataset whose layer ids are written in the other convention when "
        "they name the same layers as the drafter's (the output config is in vLLM's convention).",
    )
    ttt_steps: Annotated[int, Field(ge=1, le=16)] | None = Field(
        default=None,
        description="Test-time-training steps the drafter is unrolled over in training, "
        "independent of the serving k; default: the drafter's num_speculative_tokens (at least "
        "3, speculators' default). Held-out acceptance is measured up to max(ttt_steps, k).",
    )
    ttt_step_loss_decay: Annotated[float, Field(gt=0, le=1)] = Field(
        default=1.0,
        description="Loss weight of TTT step i is decay**i (speculators' ttt_step_loss_decay; "
        "1.0 weighs every step alike, below 1 favours the first positions, which count most).",
    )
    lr_schedule: Literal["cosine", "linear", "constant"] = Field(
        default="cosine",
        description="Learning-rate decay after warmup, to min_lr_ratio * lr at the last step "
        "(constant: no decay).",
    )
    warmup_ratio: Annotated[float, Field(ge=0, le=0.5)] = Field(
        default=0.03, description="Linear warmup over this fraction of all steps."
    )
    min_lr_ratio: Annotated[float, Field(ge=0, le=1)] = Field(
        default=0.1, description="The learning rate at the end of the schedule, relative to lr."
    )
    weight_decay: Annotated[float, Field(ge=0, le=1)] = Field(
        default=0.01, description="AdamW weight decay (speculators' default)."
    )
    held_out_fraction: Annotated[float, Field(ge=0, le=0.5)] = Field(
        default=0.05,
        description="Fraction of the conversations (by a hash of the sample id) never trained "
        "on: at every checkpoint the drafter is judged on them as vLLM would count it, and the "
        "best checkpoint by held-out acceptance length at the serving k is the drafter written. "
        "0 disables it (the last checkpoint is written).",
    )
    held_out_max_samples: Annotated[int, Field(ge=1, le=100_000)] = Field(
        default=256, description="At most this many held-out samples are judged per checkpoint."
    )
    seed: Annotated[int, Field(ge=0)] = 0
    """Seed of the initialisation and the data order."""
    precision: Literal["bf16", "fp32"] = Field(
        default="bf16",
        description="bf16: the forward and backward passes in bfloat16 autocast over fp32 "
        "master weights and optimizer state (speculators' own trainer autocasts to the hidden "
        "states' dtype; several times faster per step on Blackwell); fp32: everything in fp32.",
    )
    loss_implementation: Literal["eager", "fused"] = Field(
        default="eager",
        description="speculators' loss kernels on a GPU. eager: plain torch ops, which the "
        "drafter's compiled forward fuses; fused: its autotuned Triton kernels, which torch "
        "2.11's compiler refuses inside that forward (\"ListVariable ... is already tracked for "
        'mutation", seen on an H200 at the first step; bench/MEASUREMENTS.md). On a CPU the '
        "loss is always eager.",
    )
    loader_workers: Annotated[int, Field(ge=0, le=64)] = Field(
        default=4,
        description="Processes reading and packing stored hidden-state samples ahead of the "
        "step (pinned memory on a GPU), so a step never waits on the filesystem; 0 reads them "
        "in the training process. Offline training only.",
    )
    resume_run: Annotated[str, Field(pattern=r"^[a-z0-9]{1,16}$")] | None = Field(
        default=None,
        description="Start from the last complete checkpoint of this earlier run id (a restarted "
        "pod of the same run always resumes its own).",
    )
    rendezvous_port: Port = 29500
    """The port rank 0 listens on for the others (MASTER_PORT)."""
    shm_size: Quantity = "64Gi"
    """Size of /dev/shm in the training pods (NCCL and data loaders use it)."""
    online: OnlineTrainSettings = Field(default_factory=OnlineTrainSettings)

    @model_validator(mode="after")
    def _anchor_needs_a_base(self) -> Self:
        if self.anchor_weight and self.base_drafter is None:
            raise ValueError(
                "anchor_weight pulls toward a base drafter's weights: set base_drafter"
            )
        return self


PROMPT_SETS: tuple[str, ...] = ("chat", "reasoning")
"""The bench's built-in, seeded prompt sets."""


def _all_prompt_sets() -> list[Name]:
    return list(PROMPT_SETS)


class BenchSettings(WorkloadSettings):
    concurrency: list[Annotated[int, Field(ge=1, le=4096)]] = Field(
        min_length=1, description="Concurrency levels to measure."
    )
    prompt_sets: list[Name] = Field(
        default_factory=_all_prompt_sets,
        description="Prompt sets to measure: the built-in `chat` and `reasoning`, or a name "
        "from `prompt_files`.",
    )
    prompt_files: dict[Name, str] = Field(
        default_factory=dict,
        description="Named prompt sets read from the datasets volume (JSON Lines or Parquet, "
        "plain prompts or ShareGPT/OpenAI conversations, as datagen reads them): your own "
        "traffic, or held-out prompts of the training distribution. The first num_prompts "
        "usable rows are sent.",
    )

    @model_validator(mode="after")
    def _known_prompt_sets(self) -> Self:
        unknown = [
            n for n in self.prompt_sets if n not in PROMPT_SETS and n not in self.prompt_files
        ]
        if unknown:
            raise ValueError(
                f"prompt_sets {unknown} are neither built in ({', '.join(PROMPT_SETS)}) nor "
                "named in prompt_files"
            )
        return self

    num_prompts: Annotated[int, Field(ge=1, le=100_000)] = 200
    """Prompts per prompt set and concurrency level."""
    max_tokens: Annotated[int, Field(ge=1, le=262_144)] = 1024
    """Output tokens per bench request."""
    baseline_run: str | None = Field(
        default=None, description="Run id of a non-speculative bench to report speedups against."
    )


def _small() -> PodResources:
    return PodResources(cpu="1", memory="2Gi")


class PublishSettings(WorkloadSettings):
    """The publish Job pushes files it reads from a volume: one CPU, a little memory."""

    resources: PodResources = Field(default_factory=_small)
    """CPU and memory of the publish (and pull) pod."""


def _weights_resources() -> PodResources:
    return PodResources(cpu="4", memory="8Gi")


class WeightsSettings(StrictModel):
    """How the pinned weights (and the hub drafters) reach the models volume the pods mount."""

    via: Literal["auto", "host", "job"] = Field(
        default="auto",
        description="host: `host sync-model` downloads over SSH into host_setup.model_path, "
        "which the models claim is (the PCIe host's host-path volume); job: a download Job "
        "writes into the models claim itself (a shared filesystem that every node mounts: the "
        "rented clusters, where node-local /raid/models is not what the pods see). auto: job "
        "when the models claim is ReadWriteMany, else host.",
    )
    endpoint: str = Field(
        default="https://huggingface.co",
        pattern=r"^https?://[^\s]+$",
        description="The hub (or a mirror of it) the download Job reads from.",
    )
    streams: Annotated[int, Field(ge=1, le=64)] = Field(
        default=16, description="Connections the download Job opens at once (files and ranges)."
    )
    resources: PodResources = Field(default_factory=_weights_resources)
    """CPU and memory of the download pod."""
    pod_annotations: dict[QualifiedName, str] = Field(
        default_factory=dict, description="Extra pod annotations of the download pod."
    )


class Workloads(StrictModel):
    serve: ServeSettings
    """The serve release."""
    datagen: DatagenSettings
    """Synthetic conversations from the serve release."""
    extract: ExtractSettings
    """Hidden states of the conversations from the target."""
    vocab: VocabSettings
    train: TrainSettings
    """EAGLE-3 drafter training."""
    bench: BenchSettings
    """The bench Job (the gate's measurements)."""
    publish: PublishSettings = Field(default_factory=PublishSettings)
    weights: WeightsSettings = Field(default_factory=WeightsSettings)
    """How the weights reach the models volume (`host sync-model`)."""
