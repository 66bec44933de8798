"""The image matrix: named, pinned container images and what is inside them."""

from typing import Annotated, Literal

from pydantic import Field

from kimideploy.config.base import Digest, StrictModel

CudaArch = Literal["sm_90", "sm_100", "sm_103", "sm_120"]

# Minimum driver for each CUDA runtime minor (NVIDIA's CUDA toolkit release notes, Linux x86_64).
MIN_DRIVER_FOR_CUDA = {
    "12.4": "550.54.14",
    "12.6": "560.28.03",
    "12.8": "570.26",
    "12.9": "575.51.03",
    "13.0": "580.65.06",
}


SUFFIX_SELFCHECK = "suffix-decoding"
"""The image self-check (kimideploy.images.selfcheck) proving suffix decoding can run: the image
build runs it where Arctic Inference is installed, the serve pod's drafter-check before a load."""


SERVE_ROLE = "serve"
"""The image role of a vLLM server image (an image's role, not a workload's name)."""


class Image(StrictModel):
    """A pinned image. Manifests reference `repository@digest`, never a tag."""

    repository: str = Field(description="Registry path without tag, e.g. ghcr.io/org/vllm.")
    digest: Digest = Field(description="Pushed digest; `kimideploy image lock` records it.")
    role: Literal["serve", "train", "tools"] = Field(
        description="serve: vLLM server; train: extraction and training; tools: CPU-only jobs."
    )
    base: str = Field(description="Base image, by digest (repository@sha256:...).")
    python: Annotated[str, Field(pattern=r"^3\.\d+$")]
    """Python version inside the image."""
    cuda: Annotated[str, Field(pattern=r"^\d+\.\d+$")] | None = Field(
        default=None, description="CUDA toolkit version; none for CPU-only images."
    )
    torch: str
    """torch version inside the image."""
    vllm: str | None = Field(default=None, description="vLLM version, when installed.")
    speculators: str | None = Field(default=None, description="speculators version, if any.")
    arctic_inference: str | None = Field(
        default=None,
        description="Arctic Inference version, built from source into the image: what vLLM's "
        "suffix decoding (`method: suffix`) needs. Unset: this image cannot serve suffix.",
    )
    cuda_archs: list[CudaArch] = Field(
        default_factory=list, description="GPU architectures the image's kernels are built for."
    )
    patches: list[str] = Field(
        default_factory=list, description="Patch files under docker/patches/vllm-<version>/."
    )
    model_runner: Literal["v1", "v2"] | None = Field(
        default=None,
        description="The vLLM model runner its engine pods run (VLLM_USE_V2_MODEL_RUNNER, set in "
        "every engine pod). Unset: the engine's own default written down, v2 from vLLM 0.32 (v1 "
        "for suffix decoding, which V2 does not run), v1 before. A change is an engine change: "
        "a promoted drafter's acceptance is measured on one runner.",
    )
    run_as_user: Annotated[int, Field(ge=0)] = Field(
        default=10001,
        description="UID the workload runs as (0 only where it must). Above 10000 so that it is "
        "no host user's (pods see the host's files through the models volume).",
    )

    @property
    def reference(self) -> str:
        return f"{self.repository}@{self.digest}"
