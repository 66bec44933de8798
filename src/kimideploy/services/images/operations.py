"""Image use cases: list, render, verify, build, lock."""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from kimideploy.config.drafters import NO_DRAFTER, to_vllm_layer_ids
from kimideploy.config.loading import LoadedProject
from kimideploy.config.placeholders import EXAMPLE_IMAGE_REPOSITORIES, placeholders_allowed
from kimideploy.config.project import Project
from kimideploy.errors import KimiDeployError, MethodNotServedError, UsageError
from kimideploy.formats import extraction_engine
from kimideploy.formats.check_result import CheckResult
from kimideploy.formats.extraction_engine import version_tuple
from kimideploy.images import build as building
from kimideploy.images import kernel_derive as kernels
from kimideploy.images import verify as checks
from kimideploy.images.build_context import build_context, write_context
from kimideploy.images.cpu_vllm import engine_python
from kimideploy.images.dockerfile import get_image, render_dockerfile
from kimideploy.images.lock import lock_digest
from kimideploy.paths import cache_root, repository_root
from kimideploy.plan.asks import ServeAsk, SyntheticAcceptance
from kimideploy.plan.calibration import DEFAULT_LENGTHS, lengths_for
from kimideploy.plan.inputs import drafter_path, target_model_path
from kimideploy.plan.kernel_plan import KERNEL_PLANS
from kimideploy.plan.model import PlanRequest
from kimideploy.plan.resolve import resolve
from kimideploy.remote import connect as ssh_connect
from kimideploy.remote.local_runner import LocalRunner
from kimideploy.remote.runner import Runner
from kimideploy.services.reporting import Reporter


def image_rows(project: Project) -> list[dict[str, Any]]:
    rows = []
    for name, image in sorted(project.images.items()):
        users = sorted(
            f"{c}/{w}"
            for c, cl in project.clusters.items()
            for w, n in cl.images.model_dump().items()
            if n == name
        )
        rows.append(
            {
                "name": name,
                "role": image.role,
                "base": image.base.split("@")[0],
                "python": image.python,
                "vllm": image.vllm,
                "torch": image.torch,
                "speculators": image.speculators,
                "archs": image.cuda_archs,
                "patches": len(image.patches),
                "digest": image.digest[:19],
                "used_by": users,
            }
        )
    return rows


def dockerfile(project: Project, name: str) -> str:
    return render_dockerfile(project, name)


def serve_cases(
    loaded: LoadedProject, name: str, target: Path, drafters: Path
) -> list[dict[str, Any]]:
    """The exact serve arguments rendered for every cluster using this image, per drafter; and
    for every cluster serving an older vLLM this image could run on, the same as they would be
    after the one-line move `images.serve: NAME` (so moving a host forward is verified first).
    A serve image no cluster uses (a stack kept to reproduce, as vllm-0.16-kimi) is checked on
    the default cluster as if it served it there, so it stays verified."""
    project = loaded.project
    cases = []
    for cluster_name, cluster in sorted(project.clusters.items()):
        if cluster.images.serve == name:
            cases += _serve_cases_for(loaded, cluster_name, "", target, drafters=drafters)
        elif _could_move(project, cluster_name, name):
            cases += _moved_cases(
                loaded, cluster_name, name, "after", target=target, drafters=drafters
            )
    image, default = project.images[name], project.default_cluster
    kept = image.role == "serve" and image.vllm is not None
    if kept and not cases and project.clusters[default].gpu.arch in image.cuda_archs:
        cases += _moved_cases(loaded, default, name, "if", target=target, drafters=drafters)
    return cases


def _moved_cases(
    loaded: LoadedProject, cluster_name: str, name: str, word: str, *, target: Path, drafters: Path
) -> list[dict[str, Any]]:
    project = loaded.project
    cluster = project.clusters[cluster_name]
    moved = cluster.model_copy(update={"images": cluster.images.model_copy(update={"serve": name})})
    clusters = {**project.clusters, cluster_name: moved}
    copy = replace(loaded, project=project.model_copy(update={"clusters": clusters}))
    label = f" ({word} images.serve: {name})"
    return _serve_cases_for(copy, cluster_name, label, target, drafters=drafters)


def _could_move(project: Project, cluster_name: str, name: str) -> bool:
    cluster, image = project.clusters[cluster_name], project.images[name]
    current = project.images[cluster.images.serve]
    if image.role != "serve" or image.vllm is None or cluster.gpu.arch not in image.cuda_archs:
        return False
    return current.vllm is None or version_tuple(current.vllm) < version_tuple(image.vllm)


def _serve_cases_for(
    loaded: LoadedProject, cluster_name: str, label: str, target: Path, *, drafters: Path
) -> list[dict[str, Any]]:
    project, cases = loaded.project, []
    for drafter in [NO_DRAFTER, *sorted(project.drafters)]:
        try:
            plan = resolve(loaded, PlanRequest("serve", cluster_name, drafter))
        except MethodNotServedError:
            continue  # a method this image cannot serve is refused by the plan, before any load
        deployment = next(o.values for o in plan.objects if o.template == "deployment-serve")
        args = [
            a.replace(target_model_path(project.model_for(cluster_name)), str(target))
            for a in deployment["args"]
        ]
        case: dict[str, Any] = {"name": f"{cluster_name} --drafter {drafter}{label}"}
        record = project.eagle_drafters.get(drafter)
        if record is not None:
            args = [a.replace(drafter_path(drafter, record), str(drafters / drafter)) for a in args]
            if record.decoder == "mla":
                # Accepted is not enough: vLLM must also run the drafter's attention as MLA.
                case["expect"] = {"draft_mla": True}
        cases.append({**case, "argv": ["--model", str(target), *args]})
    return cases


CALIBRATION_KS = (1, 4)
"""The smallest and largest default k `run calibrate` serves (the others differ only in k)."""


def calibration_cases(
    loaded: LoadedProject, name: str, target: Path, drafters: Path
) -> list[dict[str, Any]]:
    """What `run calibrate --image NAME` serves on every cluster this image could run on: k
    drafts with synthetic acceptance and the control extension (vLLM >= 0.32 only)."""
    project, image = loaded.project, loaded.project.images[name]
    if image.role != "serve" or image.vllm is None or version_tuple(image.vllm) < (0, 32):
        return []
    cases = []
    for cluster_name, cluster in sorted(project.clusters.items()):
        if cluster.gpu.arch not in image.cuda_archs:
            continue
        drafter = cluster.workloads.train.drafter
        record = project.eagle_drafter(drafter)
        for k in CALIBRATION_KS:
            synthetic = SyntheticAcceptance(k, lengths_for(k, DEFAULT_LENGTHS))
            plan = resolve(
                loaded,
                PlanRequest(
                    "serve", cluster_name, drafter, ask=ServeAsk(image=name, synthetic=synthetic)
                ),
            )
            deployment = next(o.values for o in plan.objects if o.template == "deployment-serve")
            args = [
                a.replace(target_model_path(project.model_for(cluster_name)), str(target)).replace(
                    drafter_path(drafter, record), str(drafters / drafter)
                )
                for a in deployment["args"]
            ]
            cases.append(
                {
                    "name": f"{cluster_name} calibration k={k} (synthetic acceptance)",
                    "argv": ["--model", str(target), *args],
                }
            )
    return cases


def extraction_cases(
    loaded: LoadedProject, name: str, target: Path, storage: Path
) -> list[dict[str, Any]]:
    """The hidden-state extraction flags (offline extract and the online sidecar share them) for
    every cluster extracting with this image: the drafter's layers plus the final pre-norm id."""
    project = loaded.project
    cases = []
    for cluster_name, cluster in sorted(project.clusters.items()):
        if cluster.images.extract != name or cluster.workloads.extract.backend != "vllm":
            continue
        record = project.eagle_drafter(cluster.workloads.train.drafter)
        ids = to_vllm_layer_ids(record.aux_layer_ids, record.layer_id_convention)
        flags = extraction_engine.serve_flags(ids, project.model.num_hidden_layers, str(storage))
        cases.append(
            {
                "name": f"{cluster_name} extraction at vLLM layers "
                f"{extraction_engine.aux_layer_ids(ids, project.model.num_hidden_layers)}",
                "argv": ["--model", str(target), "--trust-remote-code", *flags],
            }
        )
    return cases


def write_tiny_models(project: Project, root: Path) -> tuple[Path, Path]:
    target = root / "target"
    target.mkdir(parents=True)
    (target / "config.json").write_text(json.dumps(checks.tiny_target_config(project.model)))
    for name, text in checks.tiny_tokenizer_files(1024).items():
        (target / name).write_text(text)
    drafters = root / "drafters"
    for name, record in project.eagle_drafters.items():
        folder = drafters / name
        folder.mkdir(parents=True)
        ids = to_vllm_layer_ids(record.aux_layer_ids, record.layer_id_convention)
        tiny = (
            checks.tiny_mla_drafter_config
            if record.decoder == "mla"
            else checks.tiny_drafter_config
        )
        (folder / "config.json").write_text(json.dumps(tiny(ids, record.draft_vocab_size)))
    return target, drafters


def cannot_prepare(name: str, vllm: str, cause: Exception) -> KimiDeployError:
    """What stops the checks before they start: pip or patch output (a RuntimeError, already
    trimmed to its last lines) or the cache's disk (an OSError: full, read-only, a tree another
    session keeps replacing)."""
    return KimiDeployError(
        f"{name}: cannot prepare vLLM {vllm} on this machine: {cause}",
        hint=f"the first run downloads from PyPI into {cache_root()} (later runs reuse it); "
        "check the network and the free space there, and run again",
    )


def verify_image(
    project_or_loaded: Any, name: str, reporter: Reporter, pins: bool = True
) -> list[CheckResult]:
    """All checks for one image; steps are reported as they finish."""
    loaded: LoadedProject | None = (
        project_or_loaded if isinstance(project_or_loaded, LoadedProject) else None
    )
    project = loaded.project if loaded else project_or_loaded
    image = get_image(project, name)
    steps: list[CheckResult] = []
    if pins:
        reporter.status(f"{name}: resolving pins with pip")
        steps.append(checks.resolve_pins(name, image))
    if image.vllm is None:
        return steps
    reporter.status(f"{name}: applying patches to vLLM {image.vllm} sources")
    try:
        sources = checks.vllm_sources(image.vllm)
    except (RuntimeError, OSError) as exc:
        raise cannot_prepare(name, image.vllm, exc) from exc
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "src"
        shutil.copytree(sources / "vllm", tree / "vllm")
        steps += checks.apply_patches(image, tree, dry_run=True)
    if not all(s.ok for s in steps if s.name.startswith("patch")):
        return steps
    if loaded is not None:
        steps += _engine_steps(loaded, name, image, reporter)
    return steps


def _prepared_engine(name: str, image: Any, reporter: Reporter) -> tuple[Path, Path | None]:
    """The pinned vLLM's interpreter on this CPU and its patched sources (None: no patches)."""
    reporter.status(f"{name}: preparing vLLM {image.vllm} (first run downloads and installs it)")
    try:
        python = engine_python(image.vllm)
        overlay = checks.patched_overlay(image, python) if image.patches else None
    except (RuntimeError, OSError) as exc:
        raise cannot_prepare(name, image.vllm, exc) from exc
    return python, overlay


def _engine_steps(
    loaded: LoadedProject, name: str, image: Any, reporter: Reporter
) -> list[CheckResult]:
    python, overlay = _prepared_engine(name, image, reporter)
    with tempfile.TemporaryDirectory() as tmp:
        target, drafters = write_tiny_models(loaded.project, Path(tmp))
        cases = serve_cases(loaded, name, target, drafters)
        cases += calibration_cases(loaded, name, target, drafters)
        cases += extraction_cases(loaded, name, target, Path(tmp) / "hidden-states")
        if not cases:
            return [CheckResult("serve flags", True, "no cluster serves with this image")]
        reporter.status(
            f"{name}: building vLLM's engine config for {len(cases)} rendered argument sets"
        )
        try:
            results = checks.run_engine_checks(python, overlay, cases)
        except RuntimeError as exc:
            raise KimiDeployError(
                f"{name}: vLLM {image.vllm}'s engine check did not finish: {exc}",
                hint=f"run `{python} {Path(checks.__file__).with_name('engine_check.py')}` "
                "by hand to see vLLM's own output",
            ) from exc
    steps = [
        CheckResult(f"vLLM accepts: {r['name']}", r["ok"], r["error"] or "engine config built")
        for r in results
    ]
    return [*steps, _kernel_step(loaded, name, image, python, overlay=overlay, reporter=reporter)]


def _kernel_step(
    loaded: LoadedProject,
    name: str,
    image: Any,
    python: Path,
    *,
    overlay: Path | None,
    reporter: Reporter,
) -> CheckResult:
    """The kernel plan derived again from the pinned sources, against the stored one."""
    reporter.status(f"{name}: deriving the kernel plan from vLLM {image.vllm}'s selection code")
    derived = kernels.derive(loaded.project, name, python, overlay)
    same = kernels.is_stored(name, image, derived)
    fix = f"`kimideploy image kernels {name} --write` stores what the sources select now"
    detail = "the stored plan is what the pinned sources select" if same else (
        f"the pinned sources select otherwise than {KERNEL_PLANS}: {fix}")  # fmt: skip
    return CheckResult("kernel plan", same, detail)


def kernel_plans(loaded: LoadedProject, name: str, write: bool, reporter: Reporter) -> Any:
    """`image kernels NAME`: derive the image's kernel plan, store it with --write."""
    image = get_image(loaded.project, name)
    if image.vllm is None:
        raise UsageError(f"image {name} has no vLLM: it has no kernel plan")
    python, overlay = _prepared_engine(name, image, reporter)
    derived = kernels.derive(loaded.project, name, python, overlay)
    if write:
        kernels.store(name, image, derived)
    return derived


def build_image(
    project: Project,
    name: str,
    push: bool,
    on_cluster: str | None,
    *,
    context_only: Path | None,
    reporter: Reporter,
) -> str:
    image = get_image(project, name)
    if push and image.repository in EXAMPLE_IMAGE_REPOSITORIES and not placeholders_allowed():
        raise UsageError(
            f"images.{name}.repository is still the example's ({image.repository}): --push "
            "would push to kimideploy's own registry, not yours",
            hint=f"set images.{name}.repository to a registry path you can push to "
            "(e.g. ghcr.io/<your-org>/vllm), then build again",
        )
    context = build_context(project, name)
    tag = context.tag(image.repository)
    if context_only is not None:
        path = write_context(context, context_only)
        return f"{path}\n{tag}"
    if on_cluster:
        cluster = project.clusters.get(on_cluster)
        if cluster is None or not cluster.hosts:
            raise UsageError(f"--on {on_cluster}: no hosts in that cluster profile")
        runner: Runner = ssh_connect(cluster.hosts[0])
    else:
        runner = LocalRunner()
    revision = building.git_revision(repository_root())
    reporter.info(
        f"building {tag} on {runner.host} "
        f"({len(context.files)} files, context {context.sha256[:12]})"
    )
    watch = building.Watch(lambda step: reporter.info(f"step {step}"), reporter.status)
    # The tarball is staged in a private directory of unpredictable name (mode 0700), never at a
    # fixed /tmp path another user could plant a link at.
    with tempfile.TemporaryDirectory(prefix="kimideploy-build-") as staging:
        try:
            reference = building.build(
                runner, context, image.repository, revision, push, watch, Path(staging)
            )
        finally:
            runner.close()
    if reference is None:
        return tag
    building.record_build(cache_root() / "builds", name, reference)
    return f"{reference}\nnext: kimideploy image lock {name}"


def lock_image(config: Path, project: Project, name: str, digest: str | None) -> str:
    """Write the digest of the last push of this image (or `digest`: sha256:... or
    repository@sha256:...) into the config, refusing a digest of another repository."""
    image = get_image(project, name)
    given = digest
    if given is None:
        record = cache_root() / "builds" / f"{name}.json"
        if not record.is_file():
            raise UsageError(
                f"no pushed build of {name} recorded",
                hint=f"kimideploy image build {name} --push, or pass --digest",
            )
        given = str(json.loads(record.read_text())["reference"])
    repository, _, found = given.rpartition("@")
    if repository and building.normalize(repository) != building.normalize(image.repository):
        raise UsageError(
            f"{given} is a digest of {repository}, not of images.{name}.repository "
            f"({image.repository}): the manifests would pull another image",
            hint=f"push {name} to {image.repository} (`kimideploy image build {name} --push`), "
            "or pass that repository's digest",
        )
    lock_digest(config, name, found)
    return f"images.{name}.digest = {found} in {config}"
