# syntax=docker/dockerfile:1.7
# Image vllm-0.16-kimi: rendered by kimideploy from templates/docker/Dockerfile.j2; do not edit.
# Regenerate: kimideploy image render vllm-0.16-kimi (the root Dockerfile is the default image).

# --- oras: the OCI client drafters are published and pulled with, built from its Go module -------
FROM docker.io/library/golang:1.26-bookworm@sha256:7e1a8c3f5b9d2e4f6a8c0b2d4e6f8a0c2e4b6d8f0a2c4e6b8d0f2a4c6e8b0d2f AS oras
RUN CGO_ENABLED=0 GOBIN=/out go install -trimpath -ldflags "-s -w" oras.land/oras/cmd/oras@v1.3.6

# --- build: a virtualenv with the pinned stack, patched and self-checked ------------------------
FROM docker.io/nvidia/cuda:12.9.1-cudnn-devel-ubuntu24.04@sha256:28c78fb12c758649ad36bf952e29269c806ea683cfbe6872075dbf188648163e AS build
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# DL3008 (apt versions unpinned): apt packages float within the distribution snapshot the base
# image digest pins; the Python stack, which is what matters here, is pinned in the constraints.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.12 python3.12-venv patch ca-certificates \
 && rm -rf /var/lib/apt/lists/*
RUN python3.12 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY docker/constraints/vllm-0.16-kimi.txt /opt/kimideploy/constraints.txt
RUN pip install -r /opt/kimideploy/constraints.txt
COPY docker/patches/vllm-0.16.0/ /opt/kimideploy/patches/
# A patch that no longer applies exactly (--fuzz=0) fails the build here, not in production.
WORKDIR /opt/venv/lib/python3.12/site-packages
RUN for p in /opt/kimideploy/patches/*.patch; do \
      [ -e "$p" ] || continue; echo "applying $p"; patch -p1 --forward --fuzz=0 < "$p"; \
    done
WORKDIR /opt/kimideploy/src
COPY pyproject.toml README.md ./
COPY src/ ./src/
RUN pip install --no-deps . \
 && python -m kimideploy.images.selfcheck 0001-eagle3-allow-kimi-k25-target.patch 0002-kimi-k25-media-placeholder-in-drafter.patch 0003-kimi-k25-supports-eagle3.patch

# --- runtime ------------------------------------------------------------------------------------
FROM docker.io/nvidia/cuda:12.9.1-cudnn-devel-ubuntu24.04@sha256:28c78fb12c758649ad36bf952e29269c806ea683cfbe6872075dbf188648163e AS runtime
# Passed by `kimideploy image build` (the git commit); a committed Dockerfile cannot hold its own.
ARG VCS_REF=unknown
ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 PATH=/opt/venv/bin:$PATH
# DL3008: as above, the base image digest pins the distribution snapshot.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.12 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --create-home --shell /usr/sbin/nologin kimideploy
COPY --from=build /opt/venv /opt/venv
COPY --from=oras /out/oras /usr/local/bin/oras
LABEL org.opencontainers.image.title="kimideploy vllm-0.16-kimi" \
      org.opencontainers.image.source="https://github.com/kimideploy/kimideploy" \
      org.opencontainers.image.revision="${VCS_REF}" \
      io.kimideploy.vllm.version="0.16.0" \
      io.kimideploy.speculators.version="0.4.0.1" \
      io.kimideploy.arctic-inference.version="none" \
      io.kimideploy.cuda.archs="sm_100,sm_103,sm_120" \
      io.kimideploy.patchset.sha256="ecfa5cea540b382e00165a344735c3bb932e90b80600badbb52012358cf180a1"
ENV TORCH_CUDA_ARCH_LIST="10.0;10.3;12.0" HOME=/home/kimideploy
USER 10001
WORKDIR /home/kimideploy
