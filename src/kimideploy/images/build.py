"""Building and pushing an image with the docker CLI, on this machine or on the GPU host over SSH.

The docker CLI rather than the Docker SDK: it is on every machine that has an engine, the SDK's
SSH transport shells out to `ssh` anyway, and the host already trusts our SSH runner. The commands
are built by pure functions so they can be reviewed (and tested) without an engine.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from kimideploy.errors import KimiDeployError
from kimideploy.images.build_context import BuildContext
from kimideploy.remote.runner import CommandResult, Runner

BUILD_SCRIPT = 'set -eu\ndocker build --build-arg "VCS_REF=$3" --tag "$1" - < "$2"\n'
DIGEST_FORMAT = "{{index .RepoDigests 0}}"


@dataclass(frozen=True)
class BuildPlan:
    tag: str
    context_path: str
    vcs_ref: str
    push: bool

    def build_argv(self) -> list[str]:
        return ["sh", "-c", BUILD_SCRIPT, "build", self.tag, self.context_path, self.vcs_ref]

    def push_argv(self) -> list[str]:
        return ["docker", "push", self.tag]

    def digest_argv(self) -> list[str]:
        return ["docker", "image", "inspect", "--format", DIGEST_FORMAT, self.tag]


def git_revision(root: Path) -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    dirty = subprocess.run(
        ["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True
    ).stdout
    return out.stdout.strip() + ("-dirty" if dirty.strip() else "")


def build(
    runner: Runner,
    context: BuildContext,
    repository: str,
    vcs_ref: str,
    push: bool,
    remote_dir: str,
) -> str | None:
    """Upload the context, build, and (with push) return `repository@sha256:...`."""
    local = Path(remote_dir) / f"{context.name}-{context.sha256[:12]}.tar"
    plan = BuildPlan(context.tag(repository), str(local), vcs_ref, push)
    runner.run(["mkdir", "-p", remote_dir])
    upload = Path("/tmp") / local.name
    upload.write_bytes(context.tar)
    try:
        runner.put(upload, str(local))
    finally:
        upload.unlink(missing_ok=True)
    _check(runner.run(plan.build_argv(), timeout=4 * 3600), f"building {plan.tag} on {runner.host}")
    if not push:
        return None
    _check(runner.run(plan.push_argv(), timeout=3600), f"pushing {plan.tag}")
    digest = runner.run(plan.digest_argv())
    _check(digest, f"reading the pushed digest of {plan.tag}")
    return digest.stdout.strip()


def _check(result: CommandResult, what: str) -> None:
    if not result.ok:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise KimiDeployError(
            f"{what} failed (exit {result.exit_code}):\n{tail}",
            hint="a failing self-check names the patch that did not work",
        )


def record_build(cache: Path, name: str, reference: str) -> Path:
    """Remember the last pushed digest for `image lock`."""
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"{name}.json"
    path.write_text(json.dumps({"image": name, "reference": reference}))
    return path
