"""Images without an engine: Dockerfiles, hadolint, build contexts and tags, build commands, lock."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kimideploy.config.loading import LoadedProject, load_project
from kimideploy.errors import KimiDeployError, UsageError
from kimideploy.images import build as building
from kimideploy.images import verify as checks
from kimideploy.images.build_context import build_context
from kimideploy.images.dockerfile import default_image_name, render_dockerfile
from kimideploy.images.lock import lock_digest
from kimideploy.images.selfcheck import run as selfcheck
from kimideploy.remote.runner import CommandResult
from kimideploy.services.images.operations import verify_image
from kimideploy.services.reporting import SilentReporter
from kimideploy.workloads.gpucheck import problems
from tests.conftest import EXAMPLE, REPO

IMAGES = ("vllm-0.16-kimi", "vllm-0.32-kimi", "train-speculators-0.9", "tools")


def test_root_dockerfile_is_the_rendered_default_image(example: LoadedProject) -> None:
    name = default_image_name(example.project)
    assert name == "vllm-0.32-kimi"
    assert (REPO / "Dockerfile").read_text() == render_dockerfile(example.project, name), (
        "Dockerfile is stale: .venv/bin/kimideploy image render vllm-0.32-kimi > Dockerfile"
    )


@pytest.mark.parametrize("name", IMAGES)
def test_hadolint_clean(example: LoadedProject, name: str) -> None:
    hadolint = shutil.which("hadolint") or str(REPO / ".venv" / "bin" / "hadolint")
    result = subprocess.run([hadolint, "-"], input=render_dockerfile(example.project, name),
                            capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_applies_patches_strictly_and_self_checks(example: LoadedProject) -> None:
    text = render_dockerfile(example.project, "vllm-0.16-kimi")
    assert "patch -p1 --forward --fuzz=0" in text
    assert "python -m kimideploy.images.selfcheck 0001-eagle3-allow-kimi-k25-target.patch" in text
    assert "USER 1000" in text and 'org.opencontainers.image.revision="${VCS_REF}"' in text
    assert (
        "io.kimideploy.patchset.sha256=" in text
        and "@sha256:" in text.split("FROM ", 1)[1].split()[0]
    )


def test_context_holds_only_what_the_dockerfile_needs(example: LoadedProject) -> None:
    context = build_context(example.project, "vllm-0.16-kimi")
    assert (
        "Dockerfile" in context.files and "docker/constraints/vllm-0.16-kimi.txt" in context.files
    )
    assert "docker/patches/vllm-0.16.0/0003-kimi-k25-supports-eagle3.patch" in context.files
    assert "docker/patches/vllm-0.16.0/SERIES" in context.files
    assert not [f for f in context.files if f.startswith(("tests/", "k8s/", "ansible/", ".venv"))]
    assert not [f for f in context.files if "vllm-0.32" in f or "tools.txt" in f]
    with tarfile.open(fileobj=io.BytesIO(context.tar)) as archive:
        members = archive.getmembers()
    assert all(m.mtime == 0 and m.uid == 0 for m in members)
    assert [m.name for m in members] == sorted(m.name for m in members)


def test_context_and_tag_are_stable_and_follow_the_inputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = load_project(EXAMPLE).project
    first, again = (
        build_context(project, "vllm-0.16-kimi"),
        build_context(project, "vllm-0.16-kimi"),
    )
    assert first.tar == again.tar
    tag = first.tag("ghcr.io/kimideploy/vllm")
    assert tag == f"ghcr.io/kimideploy/vllm:vllm-0.16-kimi-{first.sha256[:12]}"
    home = tmp_path / "home"
    for part in ("templates", "docker", "src", "pyproject.toml", "README.md", "kimideploy.yaml"):
        source = REPO / part
        (shutil.copytree if source.is_dir() else shutil.copy)(source, home / part)
    patch = home / "docker/patches/vllm-0.16.0/0001-eagle3-allow-kimi-k25-target.patch"
    patch.write_text(patch.read_text() + "\n")
    monkeypatch.setenv("KIMIDEPLOY_HOME", str(home))
    changed = build_context(project, "vllm-0.16-kimi")
    assert changed.tag("r") != first.tag("r")


DOCKER = REPO / "tests" / "fixtures" / "docker"  # recorded by its `record` script
PROJECT_REPOSITORY = "localhost:5000/kimideploy/vllm"
MIRROR_REPOSITORY = "127.0.0.1:5001/mirror/vllm"


def recorded_digest(name: str) -> str:
    found = re.search(r"digest: (sha256:[0-9a-f]{64})", (DOCKER / name).read_text())
    assert found is not None
    return found.group(1)


class RecordingRunner:
    """Records the commands a build issues and answers with transcripts recorded from a real
    build and push (tests/fixtures/docker/record)."""

    host = "gpu-host"

    def __init__(self, push_output: str = "push.txt", inspect: str = "") -> None:
        self.calls: list[list[str]] = []
        self.uploads: list[tuple[bytes, str]] = []
        self.push_output = push_output
        self.inspect = inspect  # what `docker image inspect` would say, if anyone asked

    def run(
        self, argv: list[str], sudo: bool = False, timeout: float = 60, stdin: str | None = None
    ) -> CommandResult:
        self.calls.append(argv)
        out = "/tmp/kimideploy-build.Ab12Cd34Ef\n" if argv[0] == "mktemp" else ""
        if argv[:3] == ["docker", "image", "inspect"]:
            out = self.inspect
        return CommandResult(" ".join(argv), 0, out, "")

    def run_streaming(
        self, argv: list[str], on_line: Callable[[str], None], stdin: str | None = None,
        timeout: float | None = None,
    ) -> CommandResult:  # fmt: skip
        self.calls.append(argv)
        name = "build-plain.txt" if argv[3] == "build" else self.push_output
        text = (DOCKER / name).read_text()
        for line in text.splitlines():
            on_line(line)
        return CommandResult(" ".join(argv), 0, text, "")

    def put(self, local: Path, remote: str) -> None:
        self.uploads.append((local.read_bytes(), remote))

    def close(self) -> None:
        pass


def watch() -> tuple[building.Watch, list[str], list[str]]:
    steps: list[str] = []
    lines: list[str] = []
    return building.Watch(steps.append, lines.append), steps, lines


def test_build_and_push_stream_and_record_the_pushed_digest(
    example: LoadedProject, tmp_path: Path
) -> None:
    context = build_context(example.project, "vllm-0.16-kimi")
    runner = RecordingRunner()
    seen, steps, lines = watch()
    result = building.build(runner, context, PROJECT_REPOSITORY, "abc123", True, seen, tmp_path)  # type: ignore[arg-type]
    tag = context.tag(PROJECT_REPOSITORY)
    remote = f"/tmp/kimideploy-build.Ab12Cd34Ef/vllm-0.16-kimi-{context.sha256[:12]}.tar"
    assert runner.uploads == [(context.tar, remote)]
    assert runner.calls == [
        ["mktemp", "-d", "-t", "kimideploy-build.XXXXXXXXXX"],
        ["sh", "-c", building.BUILD_SCRIPT, "build", tag, remote, "abc123"],
        ["sh", "-c", building.PUSH_SCRIPT, "push", tag],
        ["rm", "-rf", "--", "/tmp/kimideploy-build.Ab12Cd34Ef"],
    ]
    assert "--progress=plain" in building.BUILD_SCRIPT and "exec 2>&1" in building.BUILD_SCRIPT
    assert result == f"{PROJECT_REPOSITORY}@{recorded_digest('push.txt')}"
    # Every step shown once, as it started, in order; every line streamed as status.
    assert steps == [
        "[internal] load remote build context",
        "[internal] load metadata for docker.io/kimideploy-record/busybox:1",
        "[builder 1/4] FROM docker.io/kimideploy-record/busybox:1",
        "[builder 2/4] COPY patches/ /patches/",
        '[builder 3/4] RUN mkdir -p /opt/venv && echo "installing" && sha256sum /patches/*.patch > /opt/venv/PATCHES',
        '[builder 4/4] RUN cat /opt/venv/PATCHES && echo "ok patch-0001-example"',
        "[stage-1 2/2] COPY --from=builder /opt/venv /opt/venv",
    ]
    pushed = (DOCKER / "push.txt").read_text().splitlines()
    assert lines == (DOCKER / "build-plain.txt").read_text().splitlines() + pushed
    assert not list(tmp_path.iterdir())  # the staged tarball is gone


def test_an_image_that_carries_another_repositorys_digest_records_this_push(
    example: LoadedProject, tmp_path: Path
) -> None:
    """The recorded image was pushed to a mirror before the project's repository: its RepoDigests
    names the mirror first. The push's own output is read instead, and nothing asks inspect."""
    repo_digests = json.loads((DOCKER / "repo-digests.json").read_text())
    assert repo_digests[0].startswith(MIRROR_REPOSITORY + "@")  # what RepoDigests[0] would pin
    context = build_context(example.project, "vllm-0.16-kimi")
    runner = RecordingRunner(inspect=json.dumps(repo_digests))
    seen, _, _ = watch()
    result = building.build(runner, context, PROJECT_REPOSITORY, "x", True, seen, tmp_path)  # type: ignore[arg-type]
    assert result == f"{PROJECT_REPOSITORY}@{recorded_digest('push.txt')}"
    assert not [c for c in runner.calls if c[:2] == ["docker", "image"]]
    other = RecordingRunner(push_output="push-other-repo.txt")
    with pytest.raises(
        KimiDeployError,
        match=f"the push went to {MIRROR_REPOSITORY}, not {PROJECT_REPOSITORY}",
    ):
        building.build(other, context, PROJECT_REPOSITORY, "x", True, seen, tmp_path)  # type: ignore[arg-type]


def test_push_output_parsing_and_repository_names() -> None:
    text = (DOCKER / "push.txt").read_text()
    assert building.pushed_reference(text, PROJECT_REPOSITORY).endswith(recorded_digest("push.txt"))
    with pytest.raises(KimiDeployError, match="names no repository and digest"):
        building.pushed_reference("5f70bf18a086: Pushed\n", PROJECT_REPOSITORY)
    assert building.normalize("ubuntu") == building.normalize("docker.io/library/ubuntu")
    assert building.normalize("me/app") == "docker.io/me/app"
    assert building.normalize("localhost:5000/app") == "localhost:5000/app"


def test_a_failed_build_names_the_step_and_keeps_the_tail(tmp_path: Path) -> None:
    class Failing(RecordingRunner):
        def run_streaming(
            self, argv: list[str], on_line: Callable[[str], None], stdin: str | None = None,
            timeout: float | None = None,
        ) -> CommandResult:  # fmt: skip
            lines = ["#9 [builder 6/6] RUN python -m kimideploy.images.selfcheck patch-0003",
                     "#9 2.1 FAIL 0003-kimi-k25-supports-eagle3.patch: no SupportsEagle3"]  # fmt: skip
            for line in lines:
                on_line(line)
            return CommandResult(" ".join(argv), 1, "\n".join(lines), "")

    context = build_context(load_project(EXAMPLE).project, "tools")
    seen, _, _ = watch()
    with pytest.raises(
        KimiDeployError, match=r"building .* on gpu-host failed at step \[builder 6/6\]"
    ) as info:
        building.build(Failing(), context, "r", "x", False, seen, tmp_path)  # type: ignore[arg-type]
    assert "FAIL 0003-kimi-k25-supports-eagle3.patch" in info.value.message


def test_the_local_runner_streams_lines_as_they_are_printed() -> None:
    from kimideploy.remote.local_runner import LocalRunner

    arrived: list[float] = []
    started = time.monotonic()
    script = "echo first; sleep 1.5; echo second >&2; echo third"
    result = LocalRunner().run_streaming(
        ["sh", "-c", script], lambda _: arrived.append(time.monotonic() - started)
    )
    assert result.ok and result.stdout == "first\nthird\n" and result.stderr == "second\n"
    assert arrived[0] < 1.0 < arrived[1]  # the first line came before the command ended


def test_lock_refuses_a_digest_of_another_repository(tmp_path: Path) -> None:
    from kimideploy.services.images.operations import lock_image

    config = tmp_path / "kimideploy.yaml"
    config.write_text(EXAMPLE.read_text())
    project = load_project(config).project
    other = "registry.example.com/mirror/vllm@sha256:" + "e" * 64
    with pytest.raises(
        UsageError,
        match=r"is a digest of registry\.example\.com/mirror/vllm, not of images\.vllm-0\.32-kimi",
    ):
        lock_image(config, project, "vllm-0.32-kimi", other)
    assert config.read_text() == EXAMPLE.read_text()
    ours = project.images["vllm-0.32-kimi"].repository + "@sha256:" + "f" * 64
    lock_image(config, project, "vllm-0.32-kimi", ours)
    assert load_project(config).project.images["vllm-0.32-kimi"].digest == "sha256:" + "f" * 64


def test_lock_writes_the_digest_and_keeps_comments(tmp_path: Path) -> None:
    config = tmp_path / "kimideploy.yaml"
    config.write_text(EXAMPLE.read_text())
    digest = "sha256:" + "b" * 64
    lock_digest(config, "vllm-0.32-kimi", digest)
    loaded = load_project(config)
    assert loaded.project.images["vllm-0.32-kimi"].digest == digest
    assert loaded.project.images["vllm-0.16-kimi"].digest != digest
    assert (
        config.read_text().count("# EXAMPLE PIN") == EXAMPLE.read_text().count("# EXAMPLE PIN") - 1
    )
    assert "# kimideploy.yaml: the whole EAGLE-3 lifecycle" in config.read_text()
    with pytest.raises(UsageError, match="not a sha256 digest"):
        lock_digest(config, "tools", "latest")
    with pytest.raises(UsageError, match=r"no images\.nope in the file"):
        lock_digest(config, "nope", digest)


def row(index: int, name: str, cap: str, driver: str) -> dict[str, str]:
    return {"index": str(index), "name": name, "compute_cap": cap, "driver_version": driver}


def test_gpu_check_catches_the_blackwell_arch_mistake_in_seconds() -> None:
    rtx = [
        row(i, "NVIDIA RTX PRO 6000 Blackwell Server Edition", "12.0", "580.95.05")
        for i in range(8)
    ]
    assert problems(rtx, ["sm_100", "sm_103", "sm_120"], "12.9", 8) == []
    found = problems(rtx, ["sm_100", "sm_103"], "12.9", 8)
    assert found == [
        "NVIDIA RTX PRO 6000 Blackwell Server Edition is sm_120; this image is built for sm_100, "
        "sm_103 (use the cluster's image, or rebuild with this architecture)"
    ]


def test_gpu_check_driver_and_count() -> None:
    old = [row(i, "NVIDIA B200", "10.0", "570.86.15") for i in range(7)]
    found = problems(old, ["sm_100"], "12.9", 8)
    assert "7 GPUs visible, the pod asked for 8" in found
    assert "driver 570.86.15 is older than 575.51.03, the minimum for CUDA 12.9" in found


def test_selfcheck_refuses_a_patch_it_cannot_check() -> None:
    [(_, ok, message)] = selfcheck(["0099-something-new.patch"])
    assert not ok and "no self-check is defined" in message


def test_image_cli(capsys: pytest.CaptureFixture[str]) -> None:
    from kimideploy.cli.main import main

    assert main(["image", "list", "-o", "json"]) == 0
    assert '"name": "vllm-0.16-kimi"' in capsys.readouterr().out
    assert main(["image", "render", "nope"]) == 2
    assert "unknown image 'nope'" in capsys.readouterr().err


def test_build_context_only_and_lock_through_the_cli(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from kimideploy.cli.main import main

    assert main(["image", "build", "tools", "--context-only", str(tmp_path / "ctx")]) == 0
    path, tag = capsys.readouterr().out.split()
    assert Path(path).is_file() and tag.startswith("ghcr.io/kimideploy/tools:tools-")
    config = tmp_path / "kimideploy.yaml"
    config.write_text(EXAMPLE.read_text())
    digest = "sha256:" + "c" * 64
    assert main(["--config", str(config), "image", "lock", "tools", "--digest", digest]) == 0
    assert f"images.tools.digest = {digest}" in capsys.readouterr().out
    assert load_project(config).project.images["tools"].digest == digest


def test_lock_changes_only_the_digest_whatever_the_layout(tmp_path: Path) -> None:
    """Another indentation, a flow mapping, a quoted digest and comments everywhere: the file
    after `image lock` differs from the one before in the digest alone."""
    text = EXAMPLE.read_text()
    start, end = text.index("  vllm-0.16-kimi:\n"), text.index("  # vLLM 0.32: EAGLE-3")
    original = "sha256:0dc1628e8fbee99f666db0fc41760bfbc04182b0c0db5ebe3e8864a5183c7fa8"
    base = text[start:end].split("base: ")[1].split()[0]
    flow = (
        "  vllm-0.16-kimi: {role: serve,   # odd but valid\n"
        "      repository: ghcr.io/kimideploy/vllm,\n"
        f'      digest: "{original}",  # pinned by hand\n'
        f"      base: '{base}', python: '3.12', cuda: '12.9', torch: 2.9.1,\n"
        "      vllm: 0.16.0, speculators: 0.4.0.1, cuda_archs: [sm_100, sm_103, sm_120],\n"
        "      patches: [0001-eagle3-allow-kimi-k25-target.patch,\n"
        "                0002-kimi-k25-media-placeholder-in-drafter.patch,\n"
        "                0003-kimi-k25-supports-eagle3.patch]}\n"
    )
    edited = text[:start] + flow + text[end:]
    config = tmp_path / "kimideploy.yaml"
    config.write_text(edited)
    load_project(config)  # the edited layout is itself valid
    digest = "sha256:" + "c" * 64
    lock_digest(config, "vllm-0.16-kimi", digest)
    assert config.read_text() == edited.replace(f'"{original}"', f'"{digest}"', 1)
    assert load_project(config).project.images["vllm-0.16-kimi"].digest == digest


@pytest.mark.parametrize(
    "failure",
    [RuntimeError("cannot download vllm==0.32.0: No matching distribution"), OSError(28, "full")],
)
def test_verify_says_what_stopped_it_preparing_vllm_with_a_hint(
    example: LoadedProject, monkeypatch: pytest.MonkeyPatch, failure: Exception
) -> None:
    """A failed wheel download (pip's words) or a cache disk that refuses the extracted sources is
    a KimiDeployError naming the image and the vLLM version, with where the cache is, not a
    traceback from the middle of the checks."""

    def refuse(version: str) -> Path:
        raise failure

    monkeypatch.setattr(checks, "vllm_sources", refuse)
    name = default_image_name(example.project)
    with pytest.raises(KimiDeployError) as raised:
        verify_image(example, name, SilentReporter(), pins=False)
    assert raised.value.exit_code != 0
    assert f"{name}: cannot prepare vLLM" in str(raised.value) and str(failure) in str(raised.value)
    assert "kimideploy" in (raised.value.hint or "") and "run again" in (raised.value.hint or "")


GPU_IMAGES = ("vllm-0.16-kimi", "vllm-0.32-kimi", "train-speculators-0.9")


def stages(text: str) -> dict[str, str]:
    """The Dockerfile's stages by name (`FROM ... AS name`), each with its own lines."""
    found: dict[str, str] = {}
    name = ""
    for line in text.splitlines():
        if line.startswith("FROM "):
            name = line.split(" AS ")[-1].strip() if " AS " in line else "final"
        found[name] = found.get(name, "") + line + "\n"
    return found


@pytest.mark.parametrize("name", GPU_IMAGES)
def test_gpu_images_carry_what_the_first_kernel_needs_and_prove_it_when_built(
    example: LoadedProject, name: str
) -> None:
    """Triton compiles its launcher against Python.h with the C compiler at the first kernel, in
    the pod; NCCL's InfiniBand transport dlopens libibverbs. Both stages get what they need, and
    the runtime stage (what the pods run) proves it before the image can be pushed."""
    image = example.project.images[name]
    built = stages(render_dockerfile(example.project, name))
    python = f"python{image.python}"
    install = next(line for line in built["build"].splitlines() if "apt-get install" in line)
    assert f"{python}-dev" in install.split() and "build-essential" in install.split()
    runtime = built["runtime"]
    install = next(line for line in runtime.splitlines() if "apt-get install" in line).split()
    assert {f"{python}-dev", "gcc", "libc6-dev", "libibverbs1", "ibverbs-providers"} <= set(install)
    check = f"RUN python -m kimideploy.images.selfcheck c-toolchain cuda-archs:{','.join(image.cuda_archs)} nccl ibverbs"
    assert check in runtime
    assert (
        runtime.index("COPY --from=build /opt/venv") < runtime.index(check) < runtime.index("USER ")
    )


def test_the_cpu_image_installs_no_compiler_and_checks_no_kernels(example: LoadedProject) -> None:
    runtime = stages(render_dockerfile(example.project, "tools"))["runtime"]
    assert "gcc" not in runtime and "libibverbs" not in runtime
    assert "selfcheck" not in runtime


def test_the_toolchain_check_names_a_missing_compiler_or_python_header(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kimideploy.images import selfcheck as checks_module

    [(_, ok, message)] = selfcheck(["c-toolchain"])  # this machine has gcc and the headers
    assert ok and "compiles and links a C extension against" in message, message
    monkeypatch.setattr(checks_module, "python_include_dir", lambda: str(tmp_path))
    [(_, ok, message)] = selfcheck(["c-toolchain"])
    assert not ok and f"{tmp_path}/Python.h is missing" in message
    assert "-dev in the runtime stage" in message
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CC", raising=False)
    [(_, ok, message)] = selfcheck(["c-toolchain"])
    assert not ok and "no C compiler" in message


def test_compiled_architectures_cover_a_device_by_nvidias_compatibility_rule() -> None:
    from kimideploy.formats.gpuinfo import uncovered

    torch_213 = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]  # PyPI's cu130 wheel
    assert uncovered(["sm_100", "sm_103", "sm_120"], torch_213) == []  # 10.0 code runs on 10.3
    assert uncovered(["sm_103"], ["sm_100a"]) == ["sm_103"]  # arch-specific code runs on 10.0 only
    assert uncovered(["sm_120"], ["sm_100", "compute_120"]) == ["sm_120"]  # PTX alone: a JIT
    assert uncovered(["sm_90"], ["sm_100", "sm_120"]) == ["sm_90"]  # no newer major runs older
    assert uncovered(["sm_121"], ["sm_120"]) == []


def test_the_serve_pods_gpu_check_probes_the_device_with_the_clusters_nccl_settings(
    example: LoadedProject,
) -> None:
    from kimideploy.plan.model import PlanRequest
    from kimideploy.plan.resolve import resolve

    for cluster, probes in (("b300", "torch-arch,triton,marlin-moe,allreduce"),
                            ("rtx6000", "torch-arch,triton,marlin-moe,allreduce")):  # fmt: skip
        plan = resolve(example, PlanRequest("serve", cluster, "v3"))
        deployment = next(o.values for o in plan.objects if o.template == "deployment-serve")
        check = next(c for c in deployment["init_containers"] if c["name"] == "gpu-check")
        command = check["command"]
        assert command[command.index("--probes") + 1] == probes
        assert command[command.index("--timeout-s") + 1] == "60"
        env = {e["name"]: e.get("value") for e in check["env"]}
        wanted = {**nccl_env_of(example, cluster), **example.project.clusters[cluster].env}
        assert {k: v for k, v in env.items() if k.startswith("NCCL_")} == wanted
        assert {"name": "dshm", "mountPath": "/dev/shm"} in check["volumeMounts"]


def nccl_env_of(example: LoadedProject, cluster: str) -> dict[str, str]:
    network = example.project.clusters[cluster].network
    found = {"NCCL_IB_HCA": "=" + ",".join(network.ib_hcas)} if network.ib_hcas else {}
    return {
        **found,
        **({"NCCL_SOCKET_IFNAME": network.socket_ifname} if network.socket_ifname else {}),
    }
