"""What can never run is refused before any cluster is contacted: with no kubeconfig at all, each
of these is exit 2 with the resolver's reason, never "cannot use kube context" (exit 3), so the
user does not fix the VPN only to learn the command could never work."""

from __future__ import annotations

from pathlib import Path

import pytest

from kimideploy.cli.main import main
from tests.conftest import EXAMPLE


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["drafter", "pull", "nope", "--cluster", "b300"], "not an EAGLE-3 drafter"),
        (["drafter", "pull", "k25", "--cluster", "b300"], "not from a published artifact"),
        (
            ["run", "calibrate", "--cluster", "rtx6000", "--image", "vllm-0.16-kimi"],
            "no synthetic rejection sampling",
        ),
        (
            [
                "run",
                "bench",
                "--drafters",
                "suffix",
                "--cluster",
                "rtx6000",
                "--image",
                "vllm-0.16-kimi",
            ],
            "suffix decoding needs Arctic Inference",
        ),
        (["run", "train", "--cluster", "b300", "--drafter", "ngram"], "ngram"),
        (["up", "serve", "--set", "serve.replicas=3", "--yes"], "needs 24 GPUs"),
    ],
)
def test_refused_without_a_kube_context(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    reason: str,
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    code = main(["--config", str(EXAMPLE), *args])
    _, err = capsys.readouterr()
    assert code == 2, err
    assert reason in err and "kube context" not in err and "Traceback" not in err
