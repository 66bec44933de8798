"""Use cases that need no cluster: render a workload, describe its plan, regenerate golden files."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from kimideploy.config import placeholders
from kimideploy.config.descriptions import describe_from_docstrings
from kimideploy.config.drafters import NO_DRAFTER
from kimideploy.config.loading import LoadedProject, load_project
from kimideploy.config.project import Project
from kimideploy.config.workload_names import PULL, WEIGHTS, WORKLOAD_NAMES
from kimideploy.errors import EXIT_CODE_MEANINGS, KimiDeployError, MethodNotServedError, UsageError
from kimideploy.plan.estimates import rental_refusal
from kimideploy.plan.model import OFFLINE, ClusterAnswers, Plan, PlanRequest, pull_ask
from kimideploy.plan.refusal import drafter_refusal
from kimideploy.plan.resolve import resolve
from kimideploy.render.kustomize import MARKER, ClusterRender, kustomize_tree
from kimideploy.render.manifests import Manifest, file_name, render, render_objects, to_yaml
from kimideploy.render.schema import schema_version_for

PLAN_FACTS_SHOWN = ("datasets", "acceptance needed", "memory", "kernels", "estimate")
"""What `run` and `render` print of a plan before anything is created: where the data is, what
the drafter must reach, whether each engine fits, which kernels verify the drafts. Kept here,
not with the runs, so that `render` does not import the cluster client to print them."""


GOLDEN_DIR = Path("k8s") / "rendered"
SCHEMA_FILE = Path("schema") / "kimideploy.schema.json"


@dataclass(frozen=True)
class Rendered:
    plan: Plan
    objects: list[Manifest]
    preflight: tuple[Manifest, ...] = ()
    """Run to their end before `objects` are applied (the weights probe); never rendered out."""
    request: PlanRequest | None = None
    """What was resolved (None: not kept), so a use case can render its other forms."""

    @property
    def yaml(self) -> str:
        return to_yaml(self.objects)


def render_workload(
    loaded: LoadedProject, request: PlanRequest, answers: ClusterAnswers = OFFLINE
) -> Rendered:
    """Resolve and render one workload; raises before anything is written when invalid."""
    plan = resolve(loaded, request, answers)
    preflight = tuple(render_objects(plan.preflight, plan.kubernetes_version))
    return Rendered(plan=plan, objects=render(plan), preflight=preflight, request=request)


def refuse_before_contact(
    loaded: LoadedProject, requests: list[PlanRequest], *, force: bool = False
) -> None:
    """What can never run is refused before any cluster is contacted: each request goes through
    the resolver the command runs again once connected (capacity, methods and workloads the
    cluster's image cannot run, unknown or unpublished drafters), and a run that would outlast
    its cluster's rental (unless `force`), so the refusal comes with exit 2 whatever the state
    of the kube context."""
    plans = [resolve(loaded, request) for request in requests]
    for plan in plans:
        if not force:
            refuse_past_the_rental(loaded, plan)
    refusal = placeholder_refusal(loaded, plans)
    if refusal is not None:
        raise refusal


def placeholder_refusal(loaded: LoadedProject, plans: list[Plan]) -> UsageError | None:
    """The example's placeholder pins these plans would pull (an image digest, a revision their
    pods are given), named; the pins they do not use are not this command's business. None when
    there are none, or where KIMIDEPLOY_ALLOW_PLACEHOLDERS=1 (a rehearsal cluster)."""
    given = json.dumps(
        [[o.values for o in (*plan.objects, *plan.preflight)] for plan in plans], default=str
    )
    found = placeholders.pulled(placeholders.placeholders_of(loaded.document), given)
    what = ", ".join(sorted({f"{plan.workload} on {plan.cluster}" for plan in plans}))
    return placeholders.refusal(found, loaded.path, f"{what} would pull")


def refuse_past_the_rental(loaded: LoadedProject, plan: Plan) -> None:
    """The rental limit (plan/estimates.rental_refusal), judged on `plan`'s estimate now."""
    profile = loaded.project.clusters[plan.cluster]
    refusal = rental_refusal(plan.stage_estimate, plan.cluster, profile.rental, datetime.now(UTC))
    if refusal is not None:
        raise refusal


def write_objects(rendered: Rendered, directory: Path) -> list[Path]:
    """One file per object, numbered in apply order; the folder's other files are left alone."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for index, obj in enumerate(rendered.objects, start=1):
        path = directory / file_name(index, obj)
        path.write_text(to_yaml([obj]), encoding="utf-8")
        written.append(path)
    return written


def golden_files(config: Path) -> dict[Path, str]:
    """Every (cluster, workload[, drafter]) of a config, keyed by its path under k8s/rendered/;
    a method the cluster's serve image cannot serve (the plan refuses it) has no file, nor a
    pull where no drafter is published (source.oci)."""
    loaded = load_project(config)
    files: dict[Path, str] = {}
    published = tuple(
        sorted(
            name for name, d in loaded.project.eagle_drafters.items() if d.source.oci is not None
        )
    )
    for cluster in sorted(loaded.project.clusters):
        for workload in WORKLOAD_NAMES:
            if workload == PULL and not published:
                continue
            if workload == WEIGHTS and loaded.project.clusters[cluster].weights_via != "job":
                continue
            drafters = (
                [NO_DRAFTER, *sorted(loaded.project.drafters)] if workload == "serve" else [None]
            )
            for drafter in drafters:
                name = workload if drafter is None else f"{workload}-{drafter}"
                try:
                    request = PlanRequest(
                        workload, cluster, drafter, ask=pull_ask(workload, published)
                    )
                    rendered = render_workload(loaded, request)
                except MethodNotServedError:
                    continue
                files[GOLDEN_DIR / cluster / f"{name}.yaml"] = rendered.yaml
    return files


def config_json_schema() -> str:
    """The JSON Schema of kimideploy.yaml, for editors; committed and checked for staleness."""
    describe_from_docstrings(Project)
    schema: dict[str, Any] = Project.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "kimideploy.yaml"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


CONFIG_REFERENCE_FILE = Path("docs") / "reference" / "configuration-keys.md"
EXIT_CODE_PAGES = (Path("README.md"), Path("docs") / "reference" / "cli.md")
"""The pages that show the exit-code table, between EXIT_CODES_BEGIN and EXIT_CODES_END."""
EXIT_CODES_BEGIN = "<!-- exit codes: generated from kimideploy.errors by scripts/update-golden -->"
EXIT_CODES_END = "<!-- end of exit codes -->"


def with_exit_code_table(page: str) -> str:
    """The page with its exit-code table rendered from errors.EXIT_CODE_MEANINGS."""
    before, begin, rest = page.partition(EXIT_CODES_BEGIN)
    _, end, after = rest.partition(EXIT_CODES_END)
    if not begin or not end:
        raise ValueError(f"no {EXIT_CODES_BEGIN} ... {EXIT_CODES_END} section")
    rows = [f"| {int(code)} | {meaning} |" for code, meaning in EXIT_CODE_MEANINGS.items()]
    table = "\n".join(["| code | meaning |", "|---|---|", *rows])
    return f"{before}{begin}\n{table}\n{end}{after}"


def config_reference() -> str:
    """Every key of kimideploy.yaml with its type, default and description, from the schema
    (the descriptions in config/ are the one source): docs/reference/configuration-keys.md."""
    schema = json.loads(config_json_schema())
    rows: list[tuple[str, str, str, str]] = []
    _reference_rows(schema, schema, "", rows, seen=set())
    lines = [
        "# Every key of kimideploy.yaml",
        "",
        "Generated from the schema (`scripts/update-golden`; a test keeps it current). `<name>`",
        "is a name you choose; `|` separates the kinds an entry may be. Guide and examples:",
        "[configuration.md](configuration.md).",
        "",
        "| key | type | default | description |",
        "|---|---|---|---|",
    ]
    for path, kind, default, description in rows:
        text = " ".join(description.split()).replace("|", "\\|")
        lines.append(f"| `{path}` | {kind} | {default} | {text} |")
    return "\n".join(lines) + "\n"


def _reference_rows(
    root: dict[str, Any],
    node: dict[str, Any],
    path: str,
    rows: list[tuple[str, str, str, str]],
    *,
    seen: set[str],
) -> None:
    for name, prop in sorted(node.get("properties", {}).items()):
        key = f"{path}.{name}" if path else name
        default = f"`{json.dumps(prop['default'])}`" if "default" in prop else ""
        if name in node.get("required", []):
            default = "required"
        children = _children(root, prop)
        described = prop.get("description") or next(
            (c.get("description", "") for c, _ in children if c.get("description")), ""
        )
        if all(row[0] != key for row in rows):
            rows.append((key, _kind(prop), default, described))
        for child, suffix in children:
            if child.get("title", "") + key not in seen:
                _reference_rows(
                    root, child, key + suffix, rows, seen=seen | {child.get("title", "") + key}
                )


def _resolve(root: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    return root["$defs"][ref.rsplit("/", 1)[1]] if ref else node


def _alternatives(root: dict[str, Any], node: dict[str, Any]) -> list[dict[str, Any]]:
    members = node.get("anyOf") or node.get("oneOf")
    if members:
        return [_resolve(root, m) for m in members if m.get("type") != "null"]
    return [_resolve(root, node)]


def _children(root: dict[str, Any], prop: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """The objects below a key: itself, its map values (`.<name>`) or list items (`[]`)."""
    found: list[tuple[dict[str, Any], str]] = []
    for alternative in _alternatives(root, prop):
        values = alternative.get("additionalProperties") or next(
            iter(alternative.get("patternProperties", {}).values()), None
        )
        if isinstance(values, dict):
            found += [(m, ".<name>") for m in _alternatives(root, values) if "properties" in m]
        elif "items" in alternative and isinstance(alternative["items"], dict):
            found += [
                (m, "[]") for m in _alternatives(root, alternative["items"]) if "properties" in m
            ]
        elif "properties" in alternative:
            found.append((alternative, ""))
    return found


def _kind(prop: dict[str, Any]) -> str:
    kinds = []
    for member in prop.get("anyOf") or prop.get("oneOf") or [prop]:
        if "$ref" in member:
            kinds.append(member["$ref"].rsplit("/", 1)[1])
        elif "const" in member:
            kinds.append(f"`{json.dumps(member['const'])}`")
        elif "enum" in member:
            kinds.append(" \\| ".join(f"`{json.dumps(v)}`" for v in member["enum"]))
        elif member.get("type") == "object":
            kinds.append("map")
        elif member.get("type") == "array":
            kinds.append("list")
        elif "type" in member:
            kinds.append(str(member["type"]))
    return " \\| ".join(kinds)


def describe_plan(rendered: Rendered) -> str:
    """The human summary `up --dry-run` prints: decisions, warnings, and the objects to apply."""
    plan = rendered.plan
    drafter = "none (non-speculative)" if plan.drafter == NO_DRAFTER else plan.drafter
    lines = [f"Plan: {plan.workload} on {plan.cluster}, drafter {drafter}"]
    width = max(len(k) for k, _ in plan.facts)
    lines += [f"  {key.ljust(width)}  {value}" for key, value in plan.facts]
    if plan.warnings:
        lines.append("Warnings:")
        lines += [f"  ! {w}" for w in plan.warnings]
    version = schema_version_for(plan.kubernetes_version)
    lines.append(
        f"Objects ({len(rendered.objects)}, valid against the Kubernetes "
        f"{version[0]}.{version[1]} OpenAPI schema, strict):"
    )
    lines += [f"  {o['kind']}/{o['metadata']['name']}" for o in rendered.objects]
    return "\n".join(lines)


PLAN_SCHEMA = "kimideploy.plan.v1"


def plan_document(rendered: Rendered, refusal: KimiDeployError | None) -> dict[str, Any]:
    """What `up --dry-run -o json|yaml` prints for a pipeline to gate on: the decisions and
    predictions (the plan's facts, as `describe_plan` shows them), the warnings, the drafter's
    findings, the objects, and the refusal `up` would raise (null when it would apply)."""
    plan = rendered.plan
    return {
        "schema": PLAN_SCHEMA,
        "workload": plan.workload,
        "cluster": plan.cluster,
        "drafter": plan.drafter,
        "release": plan.release,
        "image": plan.image,
        "facts": dict(plan.facts),
        "values": plan.fact_values,
        "estimate": None
        if plan.stage_estimate is None
        else plan.stage_estimate.to_dict(plan.price_per_gpu_hour),
        "break_even": plan.break_even or None,
        "warnings": list(plan.warnings),
        "drafter_findings": [
            {"name": f.name, "status": f.status, "detail": f.detail, "fix": f.fix or None}
            for f in plan.drafter_findings
        ],
        "objects": [f"{o['kind']}/{o['metadata']['name']}" for o in rendered.objects],
        "refusal": None
        if refusal is None
        else {"reason": refusal.message, "hint": refusal.hint, "exit_code": refusal.exit_code},
    }


def kustomize_files(
    loaded: LoadedProject,
    workload: str,
    drafter: str | None,
    overrides: tuple[str, ...],
    *,
    clusters: list[str],
    force: bool = False,
    pins: bool = False,
) -> tuple[dict[PurePosixPath, str], list[str]]:
    """The Kustomize tree of `workload` over `clusters` (the first is the base); every cluster's
    render is validated as `render` validates it, and a cluster that cannot render it stops all.
    With it, each cluster's plan warnings ("CLUSTER: ..."), the judgement `render` and `up` give,
    for a GitOps pipeline to read."""
    renders, warnings = [], []
    for cluster in clusters:
        if cluster not in loaded.project.clusters:
            known = ", ".join(sorted(loaded.project.clusters))
            raise UsageError(f"--overlay {cluster}: no such cluster (clusters: {known})")
        try:
            rendered = render_workload(loaded, PlanRequest(workload, cluster, drafter, overrides))
            refusal = drafter_refusal(rendered.plan, force)
            if refusal is None and pins and not force:
                refusal = placeholder_refusal(loaded, [rendered.plan])
            if refusal is not None:
                raise refusal
        except KimiDeployError as exc:
            raise exc.restated(f"overlay {cluster}: {exc.message}") from exc
        # The GitOps gate's templates: rendered and validated as the release's objects are.
        gitops = render_objects(rendered.plan.gitops, rendered.plan.kubernetes_version)
        objects = [*rendered.objects, *gitops]
        renders.append(ClusterRender(cluster, rendered.plan.namespace, objects))
        warnings += [f"{cluster}: {warning}" for warning in rendered.plan.warnings]
    what = f"{workload}" + (f" --drafter {drafter}" if drafter else "")
    note = (
        f"Written by `kimideploy render {what} --kustomize` from {loaded.path.name} "
        f"(sha256 {loaded.sha256[:12]}); base: {clusters[0]}. Render again instead of editing."
    )
    return kustomize_tree(renders, note), warnings


def _links_in(directory: Path) -> list[str]:
    """Links at or under `directory` (the folder itself, a parent of base/, anything inside)."""
    if directory.is_symlink():
        return [str(directory)]
    if not directory.is_dir():
        return []
    found = []
    for root, dirs, files in os.walk(directory, followlinks=False):
        for name in [*dirs, *files]:
            if (Path(root) / name).is_symlink():
                found.append(str((Path(root) / name).relative_to(directory)))
    return sorted(found)


def write_tree(files: dict[PurePosixPath, str], directory: Path) -> list[Path]:
    """Write a Kustomize tree. A folder with files but no marker is refused (it may be someone's
    work); one with the marker has its base/ and overlays/ replaced, so no stale patch stays."""
    if directory.exists() and any(directory.iterdir()) and not (directory / MARKER).exists():
        raise UsageError(
            f"{directory} is not empty and was not written by `render --kustomize`; nothing "
            "was written",
            hint="name an empty or new folder (or one an earlier --kustomize wrote)",
        )
    links = _links_in(directory)
    if links:
        raise UsageError(
            f"{directory} holds symbolic links ({', '.join(links[:5])}); writing the tree would "
            "write through them to wherever they point, so nothing was written",
            hint="name a folder without links (render --kustomize writes plain files only)",
        )
    for part in ("base", "overlays"):
        shutil.rmtree(directory / part, ignore_errors=True)
    written = []
    for relative, text in files.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
