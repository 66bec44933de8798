# syntax=docker/dockerfile:1.7
# Image vllm-0.32-kimi: rendered by kimideploy from templates/docker/Dockerfile.j2; do not edit.
# Regenerate: kimideploy image render vllm-0.32-kimi (the root Dockerfile is the default image).

# --- oras: the OCI client drafters are published and pulled with, built from its Go module -------
FROM docker.io/library/golang:1.26-bookworm@sha256:7e1a8c3f5b9d2e4f6a8c0b2d4e6f8a0c2e4b6d8f0a2c4e6b8d0f2a4c6e8b0d2f AS oras
RUN CGO_ENABLED=0 GOBIN=/out go install -trimpath -ldflags "-s -w" oras.land/oras/cmd/oras@v1.3.6

# --- build: a virtualenv with the pinned stack, patched and self-checked ------------------------
FROM docker.io/nvidia/cuda:13.0.2-cudnn-devel-ubuntu24.04@sha256:9a4c2e0b8d6f4a2c0e8b6d4f2a0c8e6b4d2f0a8c6e4b2d0f8a6c4e2b0d8f6a4c AS build
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# DL3008 (apt versions unpinned): apt packages float within the distribution snapshot the base
# image digest pins; the Python stack, which is what matters here, is pinned in the constraints.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.12 python3.12-dev python3.12-venv build-essential patch ca-certificates \
 && rm -rf /var/lib/apt/lists/*
RUN python3.12 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY docker/constraints/vllm-0.32-kimi.txt /opt/kimideploy/constraints.txt
RUN pip install -r /opt/kimideploy/constraints.txt
# Suffix decoding: Arctic Inference from its source distribution (no wheel for this Python). Only
# its suffix-tree extension is built (plain C++; the CUDA ops need ARCTIC_INFERENCE_PRECOMPILED_OPS),
# against the venv's torch, with its build tools in a folder that is removed afterwards.
RUN pip install --target /tmp/arctic-tools setuptools==84.2.1 wheel==0.48.0 ninja==1.13.2 cmake==4.4.5 nanobind==2.9.2 grpcio-tools==1.85.1 \
 && PATH=/tmp/arctic-tools/bin:$PATH PYTHONPATH=/tmp/arctic-tools \
    pip install --no-build-isolation --no-deps arctic-inference==0.3.0 \
 && rm -rf /tmp/arctic-tools
# FlashInfer loads prebuilt kernels (cubins) at run time and downloads any it lacks from NVIDIA's
# artifact server, in the pod; baked in here, a pod needs no network for them and no download at
# its first call.
ENV FLASHINFER_CUBIN_DIR=/opt/venv/share/flashinfer-cubins
RUN python -m flashinfer --download-cubin \
 && find "$FLASHINFER_CUBIN_DIR" -type f -name '*.cubin' | grep -q .
COPY docker/patches/vllm-0.32.0/ /opt/kimideploy/patches/
# A patch that no longer applies exactly (--fuzz=0) fails the build here, not in production.
WORKDIR /opt/venv/lib/python3.12/site-packages
RUN for p in /opt/kimideploy/patches/*.patch; do \
      [ -e "$p" ] || continue; echo "applying $p"; patch -p1 --forward --fuzz=0 < "$p"; \
    done
WORKDIR /opt/kimideploy/src
COPY pyproject.toml README.md ./
COPY src/ ./src/
RUN pip install --no-deps . \
 && python -m kimideploy.images.selfcheck 0001-mla-eagle3-drafter-kimi-k2.patch 0002-speculation-switch.patch native-no-eagle3-allowlist native-kimi-k25-media-placeholder native-kimi-k25-supports-eagle3 native-deepseek-final-aux-layer suffix-decoding

# --- runtime ------------------------------------------------------------------------------------
FROM docker.io/nvidia/cuda:13.0.2-cudnn-devel-ubuntu24.04@sha256:9a4c2e0b8d6f4a2c0e8b6d4f2a0c8e6b4d2f0a8c6e4b2d0f8a6c4e2b0d8f6a4c AS runtime
# Passed by `kimideploy image build` (the git commit); a committed Dockerfile cannot hold its own.
ARG VCS_REF=unknown
ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 PATH=/opt/venv/bin:$PATH
# DL3008: as above, the base image digest pins the distribution snapshot.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.12 python3.12-dev gcc libc6-dev libibverbs1 ibverbs-providers ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --create-home --shell /usr/sbin/nologin kimideploy
COPY --from=build /opt/venv /opt/venv
COPY --from=oras /out/oras /usr/local/bin/oras
# vLLM asks NVIDIA's artifact server whether TRT-LLM attention's cubins exist unless this says they
# are here: a pod without that network would run FlashInfer attention without TRT-LLM kernels.
ENV FLASHINFER_CUBIN_DIR=/opt/venv/share/flashinfer-cubins VLLM_HAS_FLASHINFER_CUBIN=1
# What the first kernel needs, proven here rather than after a 25-minute load: Triton compiles its
# launcher against Python.h with the C compiler, torch's kernels run on every claimed architecture,
# NCCL loads, and so does the verbs library NCCL's InfiniBand transport opens (without it NCCL
# silently falls back to TCP sockets).
RUN python -m kimideploy.images.selfcheck c-toolchain cuda-archs:sm_100,sm_103,sm_120 nccl ibverbs flashinfer-cubins
LABEL org.opencontainers.image.title="kimideploy vllm-0.32-kimi" \
      org.opencontainers.image.source="https://github.com/kimideploy/kimideploy" \
      org.opencontainers.image.revision="${VCS_REF}" \
      io.kimideploy.vllm.version="0.32.0" \
      io.kimideploy.speculators.version="none" \
      io.kimideploy.arctic-inference.version="0.3.0" \
      io.kimideploy.cuda.archs="sm_100,sm_103,sm_120" \
      io.kimideploy.patchset.sha256="a4b9c2eed9ae261049d8d4a5dc3938e80286e1d3c013f0e656bb343f4e10b289"
ENV TORCH_CUDA_ARCH_LIST="10.0;10.3;12.0" HOME=/home/kimideploy
USER 10001
WORKDIR /home/kimideploy
