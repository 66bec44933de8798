"""The gate for GitOps tools: `render serve --kustomize` carries an Argo Rollouts AnalysisTemplate
and a Flagger MetricTemplate holding the acceptance-versus-break-even rule, validated against
those projects' CRD schemas; `up`'s own objects never include them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kimideploy.config.loading import LoadedProject, load_project
from kimideploy.errors import ManifestError
from kimideploy.plan.model import PlanRequest
from kimideploy.render.validate import validate_objects
from kimideploy.services.rendering import kustomize_files, render_workload
from tests.conftest import EXAMPLE


def with_templates(
    tmp_path: Path, watch: dict[str, object] | None = None, **gitops: object
) -> LoadedProject:
    """The example with b200's gate.gitops (and gate.watch) set: the file parsed, written again."""
    data = yaml.safe_load(EXAMPLE.read_text())
    data["clusters"]["b200"]["gate"]["gitops"] = gitops
    if watch is not None:
        data["clusters"]["b200"]["gate"]["watch"] = watch
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "kimideploy.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_project(path)


BOTH = {"templates": ["argo-rollouts", "flagger"], "window_s": 120}


def test_the_kustomize_tree_carries_both_templates_with_the_break_even_rule(tmp_path: Path) -> None:
    loaded = with_templates(tmp_path, **BOTH)
    files, _ = kustomize_files(loaded, "serve", "v3", (), clusters=["b200"])
    found = {path.name: yaml.safe_load(text) for path, text in files.items()}
    analysis = found["analysistemplate-kimi-k25-serve-acceptance.yaml"]
    metric = found["metrictemplate-kimi-k25-serve-acceptance.yaml"]
    rendered = render_workload(loaded, PlanRequest("serve", "b200", "v3"))
    rate = rendered.plan.break_even["rate"]["1"]
    [measure] = analysis["spec"]["metrics"]
    assert measure["successCondition"] == f"result[0] >= {round(rate, 4)}"
    assert measure["interval"] == "60s" and measure["failureLimit"] == 2  # watch's 3 windows
    query = measure["provider"]["prometheus"]["query"]
    assert 'namespace="kimi",model_name="kimi-k2.5"' in query
    assert "[120s]" in query and "and on() sum(increase(" in query and ">= 2000" in query
    assert metric["spec"]["provider"] == {
        "type": "prometheus",
        "address": "http://prometheus-operated.monitoring.svc:9090",
    }
    assert '{namespace="{{ namespace }}"' in metric["spec"]["query"]
    assert "[{{ interval }}]" in metric["spec"]["query"]
    assert metric["metadata"]["annotations"] == {"kimideploy.io/threshold-min": str(round(rate, 4))}
    # Listed by the overlay, so Argo CD or Flux applies them with the release.
    overlay = yaml.safe_load(
        files[next(p for p in files if str(p) == "overlays/b200/kustomization.yaml")]
    )
    resources = "\n".join(overlay["resources"]) + "\n".join(
        p.name for p in files if str(p).startswith("base/")
    )
    assert "analysistemplate-kimi-k25-serve-acceptance.yaml" in resources
    # `up` applies the release's objects: the templates are not among them.
    assert {o["kind"] for o in rendered.objects}.isdisjoint({"AnalysisTemplate", "MetricTemplate"})
    facts = dict(rendered.plan.facts)
    assert facts["gitops gate"].startswith(
        "AnalysisTemplate, MetricTemplate kimi-k25-serve-acceptance in --kustomize: acceptance >= "
    )


def test_no_template_without_a_drafter_or_unless_asked(tmp_path: Path) -> None:
    loaded = with_templates(tmp_path, **BOTH)
    plain, _ = kustomize_files(loaded, "serve", "none", (), clusters=["b200"])
    assert not [p for p in plain if "template" in p.name]
    default, _ = kustomize_files(with_templates(tmp_path), "serve", "v3", (), clusters=["b200"])
    assert not [p for p in default if "template-" in p.name]


def test_the_templates_are_held_to_their_crd_schemas(tmp_path: Path) -> None:
    loaded = with_templates(tmp_path, **BOTH)
    files, _ = kustomize_files(loaded, "serve", "v3", (), clusters=["b200"])
    analysis = next(yaml.safe_load(t) for p, t in files.items() if p.name.startswith("analysis"))
    analysis["spec"]["metrics"][0]["provider"]["prometheus"]["querry"] = "typo"
    with pytest.raises(ManifestError, match="querry"):
        validate_objects([analysis], "1.33")
    metric = next(yaml.safe_load(t) for p, t in files.items() if p.name.startswith("metric"))
    metric["spec"]["provider"]["type"] = "prom"
    with pytest.raises(ManifestError, match="prom"):
        validate_objects([metric], "1.33")
