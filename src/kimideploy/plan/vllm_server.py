"""What every `vllm serve` kimideploy starts has in common: the serve Deployment's server and the
online-training target server beside each trainer share these arguments and probe paths."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

HEALTH_PATH = "/health"
READY_PATH = "/v1/models"  # answers only once the model is served; /health may answer earlier


@dataclass(frozen=True)
class ServerBase:
    served_name: str
    port: int
    tensor_parallel_size: int
    max_model_len: int
    gpu_memory_utilization: float
    trust_remote_code: bool


def base_args(server: ServerBase, *own: str) -> list[str]:
    """The arguments after the model path that both servers pass, with each server's own in the
    middle (their order is part of the rendered Deployment: a reorder would roll the pods)."""
    args = [
        "--served-model-name",
        server.served_name,
        "--host",
        "0.0.0.0",
        "--port",
        str(server.port),
        "--tensor-parallel-size",
        str(server.tensor_parallel_size),
        "--max-model-len",
        str(server.max_model_len),
        "--gpu-memory-utilization",
        str(server.gpu_memory_utilization),
    ]
    return [*args, *own, *(["--trust-remote-code"] if server.trust_remote_code else [])]


def http_probe(
    path: str, port: int, period_s: int, timeout_s: int, *, failures: int
) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period_s,
        "timeoutSeconds": timeout_s,
        "failureThreshold": failures,
    }


def liveness_probe(port: int, initial_delay_s: int = 0) -> dict[str, Any]:
    """On /health, every 30 s, four misses: a wedged engine restarts, a slow step does not."""
    delay = {"initialDelaySeconds": initial_delay_s} if initial_delay_s else {}
    return {
        "httpGet": {"path": HEALTH_PATH, "port": port},
        **delay,
        "periodSeconds": 30,
        "timeoutSeconds": 10,
        "failureThreshold": 4,
    }
