"""Rendering an image's Dockerfile from templates/docker/Dockerfile.j2 (values placed, no logic)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from kimideploy.config.images import Image
from kimideploy.config.project import Project
from kimideploy.config.registry import RegistryClient
from kimideploy.errors import UsageError
from kimideploy.images import selfcheck
from kimideploy.paths import repository_root
from kimideploy.render.environment import environment

SOURCE_URL = "https://github.com/kimideploy/kimideploy"
# TORCH_CUDA_ARCH_LIST spelling of each architecture.
TORCH_ARCH = {"sm_90": "9.0", "sm_100": "10.0", "sm_103": "10.3", "sm_120": "12.0"}


ARCTIC_BUILD_TOOLS = (
    "setuptools==84.2.1",
    "wheel==0.48.0",
    "ninja==1.13.2",
    "cmake==4.4.5",
    "nanobind==2.9.2",
    "grpcio-tools==1.85.1",
)
"""Arctic Inference's build-system requirements, less torch (the venv's own is used); nanobind at
the version it pins. Used by the image build and the CPU venv alike."""


GPU_RUNTIME_PACKAGES = ("gcc", "libc6-dev", "libibverbs1", "ibverbs-providers")
"""What a CUDA image's runtime stage needs beyond Python and its headers: Triton compiles its
launcher (which includes Python.h) with the C compiler at the first kernel, in the pod; NCCL's
InfiniBand transport dlopens libibverbs and the providers (mlx5 among them). vLLM's own
Dockerfile installs python3.x-dev and libibverbs-dev for the same reasons."""
FLASHINFER_CUBIN_DIR = "/opt/venv/share/flashinfer-cubins"
"""Inside the venv, so the runtime stage's copy of it carries the cubins."""
BUILD_TOOLS = ("build-essential", "patch")
"""The build stage compiles Arctic Inference (C++) and patches vLLM's sources."""


def apt_packages(image: Image, stage: str) -> list[str]:
    """The apt packages of one stage of the image's Dockerfile."""
    python = f"python{image.python}"
    headers = [f"{python}-dev"] if image.cuda or stage == "build" else []
    packages = [python, *headers]
    if stage == "build":
        packages += [f"{python}-venv", *BUILD_TOOLS]
    elif image.cuda:
        packages += GPU_RUNTIME_PACKAGES
    return [*packages, "ca-certificates"]


def get_image(project: Project, name: str) -> Image:
    if name not in project.images:
        valid = ", ".join(sorted(project.images))
        raise UsageError(f"unknown image '{name}' (valid: {valid})", hint="`kimideploy image list`")
    return project.images[name]


def default_image_name(project: Project) -> str:
    """The image the root Dockerfile is: the default cluster's serve image."""
    return project.clusters[project.default_cluster].images.serve


def patch_dir(image: Image) -> str:
    return f"docker/patches/vllm-{image.vllm}" if image.vllm else "docker/patches/none"


def patch_files(image: Image) -> list[Path]:
    root = repository_root()
    return [root / patch_dir(image) / name for name in image.patches]


def patchset_sha256(image: Image) -> str:
    digest = hashlib.sha256()
    for path in patch_files(image):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def constraints_path(name: str) -> str:
    return f"docker/constraints/{name}.txt"


def dockerfile_values(
    name: str, image: Image, client: RegistryClient | None = None
) -> dict[str, Any]:
    base = image.base
    return {
        # A project without a registry publishes nothing: its images carry no ORAS.
        "oras_builder": client.builder if client else None,
        "oras_version": client.oras if client else None,
        "name": name,
        "base": base,
        "build_packages": apt_packages(image, "build"),
        "runtime_packages": apt_packages(image, "runtime"),
        "python_binary": f"python{image.python}",
        "constraints": constraints_path(name),
        "patch_dir": patch_dir(image) + "/",
        "patches": list(image.patches),
        "selfchecks": selfcheck.checks_for(
            image.vllm, list(image.patches), suffix=image.arctic_inference is not None
        ),
        "runtime_checks": selfcheck.runtime_checks_for(
            image.cuda, list(image.cuda_archs), flashinfer=image.vllm is not None
        ),
        "flashinfer_cubin_dir": FLASHINFER_CUBIN_DIR if image.vllm and image.cuda else None,
        "uid": image.run_as_user if image.run_as_user else 10001,
        "source": SOURCE_URL,
        "vllm": image.vllm or "none",
        "speculators": image.speculators or "none",
        "arctic_inference": image.arctic_inference,
        "arctic_inference_label": image.arctic_inference or "none",
        "arctic_build_tools": list(ARCTIC_BUILD_TOOLS),
        "cuda_archs": ",".join(image.cuda_archs) or "none",
        "torch_arch_list": ";".join(TORCH_ARCH[a] for a in image.cuda_archs) or "",
        "patchset_sha256": patchset_sha256(image),
    }


def render_dockerfile(project: Project, name: str) -> str:
    """The Dockerfile text; templates only place these values (StrictUndefined)."""
    image = get_image(project, name)
    env = environment(repository_root() / "templates" / "docker")
    client = project.registry.client if project.registry else None
    values = dockerfile_values(name, image, client)
    text: str = env.get_template("Dockerfile.j2").render(v=values)
    return text
