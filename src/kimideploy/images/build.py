"""Building and pushing an image with the docker CLI, on this machine or on the GPU host over SSH.

The docker CLI rather than the Docker SDK: it is on every machine that has an engine, the SDK's
SSH transport shells out to `ssh` anyway, and the host already trusts our SSH runner. The commands
are built by pure functions so they can be reviewed (and tested) without an engine.

A build takes hours, so its output is streamed as it comes (BuildKit's plain progress, stderr
folded into stdout by the script), the step being built shown as it starts, and the last lines
kept for the error when it fails. The pushed digest is read from the push itself: `docker push`
names the repository it pushed to ("The push refers to repository [R]") and the manifest digest
the registry stored for the tag ("TAG: digest: sha256:... size: N"). `docker image inspect`'s
RepoDigests is not used: it lists every repository the same image was ever pushed to or pulled
from, in no promised order, so its first entry can name another registry.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kimideploy.errors import KimiDeployError
from kimideploy.images.build_context import BuildContext
from kimideploy.remote.runner import CommandResult, Runner

BUILD_SCRIPT = (
    "set -eu\nexec 2>&1\n"
    'docker build --progress=plain --build-arg "VCS_REF=$3" --tag "$1" - < "$2"\n'
)
PUSH_SCRIPT = 'set -eu\nexec 2>&1\ndocker push "$1"\n'
PUSHED_TO = re.compile(r"^The push refers to (?:a )?repository \[(?P<repository>[^\]]+)\]\s*$")
PUSHED_DIGEST = re.compile(
    r"^(?P<tag>[\w][\w.-]{0,127}): digest: (?P<digest>sha256:[0-9a-f]{64}) size: \d+\s*$"
)
STEP = re.compile(r"^#\d+ \[(?P<where>[^\]]+)\] (?P<what>.+)$")
TAIL_LINES = 15


@dataclass(frozen=True)
class BuildPlan:
    tag: str
    context_path: str
    vcs_ref: str
    push: bool

    def build_argv(self) -> list[str]:
        return ["sh", "-c", BUILD_SCRIPT, "build", self.tag, self.context_path, self.vcs_ref]

    def push_argv(self) -> list[str]:
        return ["sh", "-c", PUSH_SCRIPT, "push", self.tag]


@dataclass
class Watch:
    """Turns a build's streamed lines into progress: each step as it starts, every line as
    status, and the tail kept for an error."""

    show_step: Callable[[str], None]
    show_line: Callable[[str], None]
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    steps: list[str] = field(default_factory=list)

    def __call__(self, line: str) -> None:
        self.tail.append(line)
        step = STEP.match(line)
        if step is not None:
            started = f"[{step.group('where')}] {step.group('what')}"
            if started not in self.steps:
                self.steps.append(started)
                self.show_step(started)
        self.show_line(line)


def pushed_reference(output: str, repository: str) -> str:
    """`repository@sha256:...` from a push's own output, checked to be this repository's."""
    pushed_to = digest = None
    for line in output.splitlines():
        if (found := PUSHED_TO.match(line.strip())) is not None:
            pushed_to = found.group("repository")
        if (found := PUSHED_DIGEST.match(line.strip())) is not None:
            digest = found.group("digest")
    if pushed_to is None or digest is None:
        raise KimiDeployError(
            "the push output names no repository and digest ('The push refers to repository "
            "[...]' and 'TAG: digest: sha256:... size: N')",
            hint="push again; `docker push` prints both when the registry accepted the manifest",
        )
    if normalize(pushed_to) != normalize(repository):
        raise KimiDeployError(
            f"the push went to {pushed_to}, not {repository}: refusing to record its digest",
            hint=f"tag the build as {repository} (images.<name>.repository) and push again",
        )
    return f"{repository}@{digest}"


def normalize(repository: str) -> str:
    """Docker Hub's implicit registry and library/ prefix, made explicit for comparing."""
    parts = repository.split("/")
    if len(parts) == 1 or ("." not in parts[0] and ":" not in parts[0] and parts[0] != "localhost"):
        parts = ["docker.io", *parts]
    if parts[0] == "docker.io" and len(parts) == 2:
        parts = ["docker.io", "library", parts[1]]
    return "/".join(parts)


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
    watch: Watch,
    staging: Path,
) -> str | None:
    """Upload the context, build (streamed), and with push return `repository@sha256:...` as the
    push reported it. `staging` is a private directory for the tarball on this side; on the
    building side it goes to a fresh `mktemp -d` directory, removed afterwards."""
    made = runner.run(["mktemp", "-d", "-t", "kimideploy-build.XXXXXXXXXX"])
    remote_dir = made.stdout.strip()
    if not made.ok or not remote_dir.startswith("/"):
        raise KimiDeployError(
            f"cannot make a build directory on {runner.host}: {made.stderr.strip() or made.stdout}"
        )
    try:
        return _build_in(
            runner,
            context,
            repository,
            vcs_ref,
            push=push,
            watch=watch,
            staging=staging,
            remote_dir=remote_dir,
        )
    finally:
        runner.run(["rm", "-rf", "--", remote_dir])


def _build_in(
    runner: Runner,
    context: BuildContext,
    repository: str,
    vcs_ref: str,
    *,
    push: bool,
    watch: Watch,
    staging: Path,
    remote_dir: str,
) -> str | None:
    remote = f"{remote_dir}/{context.name}-{context.sha256[:12]}.tar"
    plan = BuildPlan(context.tag(repository), remote, vcs_ref, push)
    upload = staging / Path(remote).name
    upload.write_bytes(context.tar)
    try:
        runner.put(upload, remote)
    finally:
        upload.unlink(missing_ok=True)
    built = runner.run_streaming(plan.build_argv(), watch, timeout=4 * 3600)
    _check(built, f"building {plan.tag} on {runner.host}", watch)
    if not push:
        return None
    pushed = runner.run_streaming(plan.push_argv(), watch, timeout=3600)
    _check(pushed, f"pushing {plan.tag}", watch)
    return pushed_reference(pushed.stdout, repository)


def _check(result: CommandResult, what: str, watch: Watch) -> None:
    if not result.ok:
        lines = list(watch.tail) or (result.stdout + result.stderr).strip().splitlines()
        tail = "\n".join(lines[-TAIL_LINES:])
        step = f" at step {watch.steps[-1]}" if watch.steps else ""
        everything = "\n".join([*lines, result.stdout, result.stderr])
        raise KimiDeployError(
            f"{what} failed{step} (exit {result.exit_code}):\n{tail}",
            hint=failure_hint(everything),
        )


FAILURE_CLASSES = (
    (
        (
            "unauthorized",
            "authentication required",
            "denied: requested access",
            "403 forbidden",
            "no basic auth credentials",
            "insufficient_scope",
        ),
        "the registry refused the credentials: `docker login HOST` on the builder with an "
        "account that may push to images.NAME.repository",
    ),
    (
        (
            "failed to resolve source metadata",
            "pull access denied",
            "manifest unknown",
            "no such host",
            "tls handshake timeout",
            "i/o timeout",
            "failed to do request",
        ),
        "a base image could not be pulled: check the builder's network and registry mirror, and "
        "that images.NAME.base names a digest that exists",
    ),
    (
        ("kimideploy.images.selfcheck", "self-check", "selfcheck"),
        "the image's self-check failed: its output above names the patch or the check that did "
        "not hold (docs/usage/images.md)",
    ),
)
"""Docker's failures by class, each with what to do (lower-case fragments of its output)."""


def failure_hint(output: str) -> str:
    """What to do about a failed build or push, by the class of Docker's error in `output`."""
    lowered = output.lower()
    for fragments, hint in FAILURE_CLASSES:
        if any(fragment in lowered for fragment in fragments):
            return hint
    return (
        "a build step failed: its output above says why; `kimideploy image build NAME "
        "--context-only DIR` writes the context to build by hand"
    )


def record_build(cache: Path, name: str, reference: str) -> Path:
    """Remember the last pushed digest for `image lock`."""
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"{name}.json"
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps({"image": name, "reference": reference}))
    partial.replace(path)
    return path
