"""A CPU environment with torch and transformers (the pinned vLLM 0.16 stack plus `accelerate`),
a tiny model made in the test, and a real OpenAI-compatible server (`transformers serve`)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from kimideploy.images.verify import cache_root, vllm_venv
from tests.conftest import REPO

HERE = Path(__file__).resolve().parent


def workloads_python() -> Path:
    """A venv that reuses the pinned vLLM 0.16 stack's site-packages (torch, transformers) through
    a .pth file and adds only what `transformers serve` needs; the pinned venv stays untouched."""
    base = vllm_venv("0.16.0")
    venv = cache_root() / "venvs" / "workloads-torch-2.9.1"
    python = venv / "bin" / "python"
    if not (venv / ".complete").is_file():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        site = next(venv.glob("lib/python3*/site-packages"))
        (site / "pinned-vllm-stack.pth").write_text(
            str(next(base.glob("lib/python3*/site-packages"))) + "\n"
        )
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "accelerate"], check=True)
        (venv / ".complete").write_text("ok")
    return python


SPECULATORS = "0.9.0"
TORCH_FAMILY = ("torch==2.9.1", "torchvision==0.24.1", "torchaudio==2.9.1")


def train_python() -> Path:
    """speculators (it needs transformers 5) over the same .pth-shared torch 2.9.1: the venv's
    own site-packages come before the .pth path, so its transformers 5 wins over the pinned 4.x.
    The train image itself pins torch 2.10.0 (docker/constraints/train-speculators-0.9.txt);
    on CPU the model code under test is the same."""
    base = vllm_venv("0.16.0")
    venv = cache_root() / "venvs" / f"train-speculators-{SPECULATORS}-torch-2.9.1"
    python = venv / "bin" / "python"
    if not (venv / ".complete").is_file():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        site = next(venv.glob("lib/python3*/site-packages"))
        (site / "pinned-vllm-stack.pth").write_text(
            str(next(base.glob("lib/python3*/site-packages"))) + "\n"
        )
        constraints = venv / "constraints.txt"
        constraints.write_text("\n".join(TORCH_FAMILY) + "\n")
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", f"speculators=={SPECULATORS}",
             "-c", str(constraints)],
            check=True,
        )  # fmt: skip
        (venv / ".complete").write_text("ok")
    return python


@pytest.fixture(scope="session")
def torch_python() -> Path:
    return workloads_python()


@pytest.fixture(scope="session")
def speculators_python() -> Path:
    return train_python()


@pytest.fixture(scope="session")
def tiny_model(torch_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "model"
    subprocess.run([str(torch_python), str(HERE / "make_tiny_model.py"), str(out), "4"], check=True)
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def openai_server(
    torch_python: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    port = free_port()
    log = (tmp_path_factory.mktemp("serve") / "serve.log").open("w")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    process = subprocess.Popen(
        [str(torch_python), "-m", "transformers.commands.transformers_cli", "serve", "--host", "127.0.0.1",
         "--port", str(port), "--device", "cpu", "--force_model", str(tiny_model)],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    body = json.dumps({"model": str(tiny_model), "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 2, "stream": True}).encode()  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            request = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                             headers={"Content-Type": "application/json"})  # fmt: skip
            with urllib.request.urlopen(request, timeout=30) as response:
                response.read()
                break
        except OSError:
            time.sleep(1)
    else:
        process.kill()
        pytest.fail("transformers serve did not answer within 120 s")
    yield url
    process.terminate()
    process.wait(timeout=30)


def run_workload(
    name: str, spec: Path, python: str = sys.executable, **env: str
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [python, "-m", "kimideploy.workloads", name, "--spec", str(spec)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "src"), **env},
    )  # fmt: skip
