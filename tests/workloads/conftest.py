"""A CPU environment with torch, transformers and speculators (the pipeline tier's vLLM 0.32 venv),
a tiny model made in the test, and a real OpenAI-compatible server (`transformers serve`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from kimideploy.images.cpu_vllm import cpu_vllm_python
from tests.conftest import REPO
from tests.ports import free_port

HERE = Path(__file__).resolve().parent


def workloads_python() -> Path:
    """The one CPU stack of the workload tests: the pipeline tier's vLLM 0.32 venv (torch 2.13,
    transformers 5, speculators 0.9, accelerate for `transformers serve`). The images pin their
    own versions (docker/constraints/); on CPU the code under test is the same."""
    return cpu_vllm_python()


def train_python() -> Path:
    """speculators 0.9.0 lives in the same venv (vLLM 0.32 and speculators 0.9 both want
    transformers 5)."""
    return cpu_vllm_python()


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


@pytest.fixture(scope="session")
def openai_server(
    torch_python: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    port = free_port()
    log = (tmp_path_factory.mktemp("serve") / "serve.log").open("w")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    process = subprocess.Popen(
        # transformers 5.19's CLI: the forced model is positional.
        [str(torch_python), "-m", "transformers.cli.transformers", "serve", str(tiny_model),
         "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"],
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
