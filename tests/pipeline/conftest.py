"""The pipeline tier: the EAGLE-3 lifecycle with real vLLM 0.32 (the CPU build) on this machine.

One session-scoped run of every stage, in order, each through kimideploy's own rendering and the
workloads' own entry points (tests/pipeline/pods.py), on an informative target: a small model
trained on the Python standard library (make_target.py, cached by target_cache.py) whose greedy
answers carry real uncertainty, so a drafter's acceptance says how well it was trained, on which
features, for which target. Datagen against `vllm serve` of it, extraction with vLLM's
`extract_hidden_states` (and the reference backend to compare), vocab, offline training with the
held-out judgement, online training against a real vLLM sidecar, then drafters served with the
rendered `--speculative-config` and benchmarked by the bench workload against vLLM's own
counters on held-out prompts: the correct one and one of each known mistake (untrained, layer
ids one off, features rendered with another chat template, trained for another target of the
same shape). Tests assert on what each stage left behind; the figures (rates, sizes, acceptance)
are collected in FIGURES and printed at the end (bench/pipeline.py prints them too). Skipped
with the reason when the CPU vLLM cannot be installed, unless KIMIDEPLOY_REQUIRE_PIPELINE=1
(set by .ci/run), which turns the skip into a failure.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from tests import registry as test_registry
from tests.integration.conftest import _bin_dir, harness, served_pod_monitor_crd
from tests.pipeline import pods, stdlib_corpus
from tests.pipeline.figures import FIGURES
from tests.pipeline.target_cache import informative_target

from kimideploy.cli.main import main
from kimideploy.config.loading import LoadedProject, load_project
from kimideploy.config.specs import SPEC_FILE_NAME
from kimideploy.formats.drafter_swap import WANTED_SPEC_ENV

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "kimideploy.yaml"
CONTEXT = "kimideploy-test"
"""The test control plane's kubeconfig context (scripts/testcluster)."""


def _require() -> bool:
    return os.environ.get("KIMIDEPLOY_REQUIRE_PIPELINE") == "1"


@pytest.fixture(scope="session")
def cpu_python() -> Path:
    from kimideploy.images.cpu_vllm import cpu_vllm_python

    try:
        return cpu_vllm_python()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        if _require():
            pytest.fail(f"the CPU vLLM venv could not be built: {exc}")
        pytest.skip(f"the CPU vLLM venv could not be built: {exc}")


@pytest.fixture(scope="session")
def project() -> LoadedProject:
    return load_project(CONFIG)


@dataclass
class Volumes:
    """The cluster's claims and the pod-local scratch, as local folders."""

    root: Path
    roots: dict[str, Path | str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for mount in ("models", "data", "hidden-states", "checkpoints", "scratch", "cache"):
            (self.root / mount).mkdir(parents=True, exist_ok=True)
            self.roots[f"/{mount}"] = self.root / mount

    def local(self, pod_path: str) -> Path:
        return Path(pods.localize(pod_path, self.roots))

    def mounts(self, rendered: pods.Rendered, pod: str) -> pods.PodMounts:
        """The rendered pod's writable mounts: its processes run with a read-only root."""
        return pods.pod_mounts(rendered, self.roots, self.root / "pods" / pod)

    def start_serving(
        self, python: Path, rendered: pods.Rendered, pod: str, host: str = "127.0.0.1",
        netns: str | None = None, port: int | None = None, env: dict[str, str] | None = None,
    ) -> tuple[pods.Server, pods.PodMounts]:  # fmt: skip
        """The rendered serve container's `vllm serve` on this CPU: its arguments as the CPU
        needs them (pods.cpu_vllm_args), its Secret-backed and vLLM variables (and `env`, a
        test's own), its read-only root with its writable mounts, its spec volume and its
        readiness path; logged to ROOT/POD.log."""
        assert rendered.vllm_model is not None
        args = pods.localize(pods.cpu_vllm_args(rendered.vllm_args, host,
                                                port or pods.free_port()), self.roots)  # fmt: skip
        mounts = self.mounts(rendered, pod)
        # The pod's paths in its variables too (the keeper's models mount, DRAFTERS_ROOT_ENV).
        env = pods.localize({**rendered.secret_env, **rendered.vllm_env}, self.roots) | (env or {})
        if WANTED_SPEC_ENV in env:  # the drafter keeper reads the pod's spec volume
            self.mount_spec(pod, json.dumps(rendered.spec))
            env[WANTED_SPEC_ENV] = str(self.spec_folder(pod) / SPEC_FILE_NAME)
        server = pods.start_vllm(python, str(self.local(rendered.vllm_model)), args,
                                 self.root / f"{pod}.log", netns=netns, env=env,
                                 ready_path=rendered.ready_path, mounts=mounts)  # fmt: skip
        return server, mounts

    def spec_folder(self, pod: str) -> Path:
        return self.root / "pods" / pod / "spec"

    def mount_spec(self, pod: str, spec_json: str) -> None:
        """What the kubelet does with the pod's spec ConfigMap volume: the file replaced whole
        (its paths made this machine's)."""
        folder = self.spec_folder(pod)
        folder.mkdir(parents=True, exist_ok=True)
        draft = folder / f".{SPEC_FILE_NAME}.new"
        draft.write_text(json.dumps(pods.localize(json.loads(spec_json), self.roots)))
        draft.replace(folder / SPEC_FILE_NAME)

    def spec(self, rendered: pods.Rendered, **urls: str) -> dict[str, Any]:
        roots = {**self.roots, **urls}
        spec: dict[str, Any] = pods.localize(rendered.spec, roots)
        return spec


@pytest.fixture(scope="session")
def volumes(tmp_path_factory: pytest.TempPathFactory) -> Volumes:
    return Volumes(tmp_path_factory.mktemp("cluster"))


@pytest.fixture(scope="session")
def built_target(cpu_python: Path) -> Path:
    """served/ and previous/ (make_target.py), from the cache or built once (minutes)."""
    started = time.monotonic()
    root = informative_target(cpu_python, pods.cpu_env(cpu_python))
    record = json.loads((root / "built.json").read_text())
    FIGURES["target: build (s), this run / when built"] = (
        f"{time.monotonic() - started:.1f} / {record['build_seconds']}"
    )
    FIGURES["target: final loss (previous, served)"] = (
        f"{record['loss_previous']:.3f}, {record['loss']:.3f}"
    )
    # The same on every x86-64 machine (target_cache.SAME_ON_ANY_CPU): compare across runs.
    FIGURES["target: served weights sha256"] = record.get("weights_sha256", {}).get("served")
    return root


@pytest.fixture(scope="session")
def target(built_target: Path, project: LoadedProject, volumes: Volumes) -> Path:
    """The served target, where `host sync-model` would put it (with its marker)."""
    rendered = pods.rendered(project, "datagen")
    path = volumes.local(rendered.spec["target"]["path"])
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(built_target / "served", path)
    (path / ".kimideploy-complete").write_text("synced")
    return path


def target_variant(built_target: Path, volumes: Volumes, name: str, template: str | None) -> Path:
    """A copy of a built checkpoint (served or previous) on the models volume, optionally with
    another chat template in its tokenizer config: what a training run pointed at the wrong
    checkpoint or tokenizer would read."""
    source = built_target / ("previous" if name == "previous" else "served")
    path = volumes.root / "models" / "variants" / name
    if not path.exists():
        shutil.copytree(source, path)
        if template is not None:
            config_file = path / "tokenizer_config.json"
            config = json.loads(config_file.read_text())
            config["chat_template"] = (
                HERE.parent / "fixtures" / "chat_templates" / template
            ).read_text()
            config_file.write_text(json.dumps(config, indent=2))
            (path / "chat_template.jinja").unlink(missing_ok=True)
    return path


@pytest.fixture(scope="session")
def target_server(
    cpu_python: Path, project: LoadedProject, target: Path, volumes: Volumes
) -> pods.Server:
    """The non-speculative serve release (`render serve --drafter none`), kept for datagen and the
    gate's baseline bench."""
    rendered = pods.rendered(project, "serve", "none")
    started = time.monotonic()
    server, _ = volumes.start_serving(cpu_python, rendered, "serve-none")
    try:
        pods.wait_ready([server])
    except RuntimeError:
        server.stop()
        raise
    FIGURES["vLLM start-up, target (s)"] = round(time.monotonic() - started, 1)
    yield server  # type: ignore[misc]
    server.stop()


def service_urls(
    project: LoadedProject, server: pods.Server, cluster: str = "cpu", namespace: str | None = None
) -> dict[str, str]:
    """The serve Service's in-cluster URL, as the specs name it (in the profile's namespace, or
    the one a test's release runs in), mapped to a local server."""
    profile = project.project.clusters[cluster]
    where = namespace or profile.namespace
    url = f"http://{project.project.name}-serve.{where}.svc:{profile.workloads.serve.port}"
    return {url: server.url}


@pytest.fixture(scope="session")
def conversations(
    cpu_python: Path, project: LoadedProject, target_server: pods.Server, volumes: Volumes
) -> dict[str, Any]:
    """datagen, as its Job runs it, against the real server; prompts held out from the bench's."""
    rendered = pods.rendered(project, "datagen")
    assert set(rendered.secret_env) == {"KIMIDEPLOY_API_KEY"}  # it calls the serve release
    spec = volumes.spec(rendered, **service_urls(project, target_server))
    prompt_file = Path(spec["prompts"])
    prompt_file.parent.mkdir(parents=True, exist_ok=True)
    samples = project.project.clusters["cpu"].workloads.datagen.samples
    write_rows(prompt_file, stdlib_corpus.prompt_rows("prompts", "code", samples))
    for domain in ("code", "docs"):
        write_rows(prompt_file.parent / f"heldout-{domain}.jsonl",
                   stdlib_corpus.prompt_rows("heldout", domain, 96))  # fmt: skip
    started = time.monotonic()
    code, out, err = pods.run_workload(cpu_python, "datagen", spec, volumes.root,
                                       mounts=volumes.mounts(rendered, "datagen"),
                                       **rendered.secret_env)  # fmt: skip
    seconds = time.monotonic() - started
    assert code == 0, err[-3000:]
    result = pods.events(out, "result")[-1]
    FIGURES["datagen: samples/s"] = round(result.get("samples", samples) / seconds, 2)
    return {"spec": spec, "result": result, "stdout": out, "stderr": err, "seconds": seconds}


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


@pytest.fixture(scope="session")
def features(
    cpu_python: Path, project: LoadedProject, conversations: dict[str, Any], volumes: Volumes
) -> dict[str, Any]:
    """extract with backend vllm (the rendered spec unchanged), then the reference backend into
    another folder, for the comparison."""
    rendered = pods.rendered(project, "extract")
    spec = volumes.spec(rendered)
    assert spec["backend"] == "vllm"
    started = time.monotonic()
    mounts = volumes.mounts(rendered, "extract")
    code, out, err = pods.run_workload(cpu_python, "extract", spec, volumes.root, mounts=mounts)
    seconds = time.monotonic() - started
    assert code == 0, err[-4000:]
    manifest = json.loads((Path(spec["output_dir"]) / "shard-00000" / "manifest.json").read_text())
    result = pods.events(out, "result")[-1]
    FIGURES["extract (vLLM): tokens/s"] = result["tokens_per_s"]
    FIGURES["extract (vLLM): tokens/s incl. engine start"] = round(result["tokens"] / seconds, 1)
    FIGURES["extract: bytes per token (minimum)"] = (
        f"{result['bytes_per_token']} ({result['bytes_per_token_minimum']})"
    )
    reference = dict(spec, backend="transformers", output_dir=spec["output_dir"] + "-reference",
                     fingerprint={**spec["fingerprint"], "backend": "transformers",
                                  "engine": "transformers"})  # fmt: skip
    code, _, err = pods.run_workload(cpu_python, "extract", reference, volumes.root,
                                     mounts=mounts)  # fmt: skip
    assert code == 0, err[-3000:]
    return {"vllm": Path(spec["output_dir"]), "reference": Path(reference["output_dir"]),
            "manifest": manifest, "stdout": out, "seconds": seconds}  # fmt: skip


@pytest.fixture(scope="session")
def vocab_run(
    cpu_python: Path, project: LoadedProject, features: dict[str, Any], volumes: Volumes
) -> dict[str, Any]:
    rendered = pods.rendered(project, "vocab")
    spec = volumes.spec(rendered)
    started = time.monotonic()
    code, out, err = pods.run_workload(cpu_python, "vocab", spec, volumes.root,
                                       mounts=volumes.mounts(rendered, "vocab"))  # fmt: skip
    seconds = time.monotonic() - started
    assert code == 0, err[-3000:]
    return {"output": Path(spec["output_dir"]), "stdout": out, "seconds": seconds}


@pytest.fixture(scope="session")
def vocab(vocab_run: dict[str, Any]) -> Path:
    output: Path = vocab_run["output"]
    return output


def share_data(volumes: Volumes, project: LoadedProject, drafter: str, *workloads: str) -> None:
    """Data folders are keyed by the drafter a run builds; `untrained` and `shifted` reuse what
    was made for `good` (same target, same vocabulary size; `untrained` the same layers)."""
    for workload in workloads:
        good = pods.rendered(project, workload).spec
        other = pods.rendered(project, workload, overrides=(f"train.drafter={drafter}",)).spec
        for key in ("conversations_dir", "output_dir"):
            source, link = volumes.local(good[key]), volumes.local(other[key])
            if not link.exists():
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(source, target_is_directory=True)


TRAIN_SEED_VARIABLE = "KIMIDEPLOY_PIPELINE_TRAIN_SEED"
"""When set, every drafter the tier trains uses this `train.seed` (the tier's own is the config's,
0): bench/acceptance_seeds.py runs the acceptance test under several seeds with it."""


def train(cpu_python: Path, project: LoadedProject, volumes: Volumes, *overrides: str,
          target_path: Path | None = None, **urls: str) -> dict[str, Any]:  # fmt: skip
    """The train Job's pod, as rendered; `target_path` points it at another checkpoint or
    tokenizer (the mistakes the tier reproduces)."""
    seed = os.environ.get(TRAIN_SEED_VARIABLE)
    if seed is not None:
        overrides = (*overrides, f"train.seed={seed}")
    rendered = pods.rendered(project, "train", overrides=overrides)
    spec = volumes.spec(rendered, **urls)
    if target_path is not None:
        spec["target"]["path"] = str(target_path)
    started = time.monotonic()
    mounts = volumes.mounts(rendered, f"train-{spec['drafter']}")
    code, out, err = pods.run_workload(cpu_python, "train", spec, volumes.root, timeout=1800,
                                       mounts=mounts)  # fmt: skip
    seconds = time.monotonic() - started
    assert code == 0, err[-4000:]
    progress = pods.events(out, "progress")
    return {"spec": spec, "out": Path(spec["output_dir"]), "progress": progress,
            "seconds": seconds, "rendered": rendered, "stderr": err, "stdout": out,
            "evaluations": pods.events(out, "evaluation"),
            "result": pods.events(out, "result")[-1]}  # fmt: skip


def extract_reference(cpu_python: Path, project: LoadedProject, volumes: Volumes,
                      overrides: tuple[str, ...], target_path: Path) -> None:  # fmt: skip
    """Features with the reference backend (transformers) of another checkpoint or tokenizer."""
    rendered = pods.rendered(project, "extract", overrides=overrides)
    spec = volumes.spec(rendered)
    spec["target"]["path"] = str(target_path)
    mounts = volumes.mounts(rendered, f"extract-{overrides[0].split('=')[1]}")
    code, _, err = pods.run_workload(cpu_python, "extract", spec, volumes.root, mounts=mounts)
    assert code == 0, err[-3000:]


@pytest.fixture(scope="session")
def good_drafter(
    cpu_python: Path, project: LoadedProject, vocab: Path, volumes: Volumes
) -> dict[str, Any]:
    run = train(cpu_python, project, volumes)
    steps = run["progress"][-1]["step"] if run["progress"] else 0
    FIGURES["train (offline): steps/s"] = round(steps / run["seconds"], 2)
    held_out = run["result"]["held_out"]["mean_acceptance_length"]
    FIGURES["good: held-out mean acceptance length (k=1,2,3)"] = ", ".join(
        f"{held_out[k]:.2f}" for k in ("1", "2", "3")
    )
    FIGURES["good: checkpoint written"] = run["result"]["selected"]["reason"]
    return run


@pytest.fixture(scope="session")
def untrained_drafter(
    cpu_python: Path, project: LoadedProject, vocab: Path, volumes: Volumes
) -> dict[str, Any]:
    share_data(volumes, project, "untrained", "vocab", "extract")
    return train(cpu_python, project, volumes, "train.drafter=untrained", "train.lr=1e-9",
                 "train.epochs=1", "train.held_out_fraction=0")  # fmt: skip


@pytest.fixture(scope="session")
def shifted_drafter(good_drafter: dict[str, Any], volumes: Volumes) -> Path:
    """The convention mistake: good's files served where the registry records SGLang ids [2, 3,
    4], so its config.json carries vLLM [3, 4, 5] and vLLM feeds it the layers one above the
    ones it was trained on."""
    out = volumes.root / "models" / "drafters" / "shifted"
    if not out.exists():
        shutil.copytree(good_drafter["out"], out)
        config = json.loads((out / "config.json").read_text())
        config["eagle_aux_hidden_state_layer_ids"] = [3, 4, 5]
        (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


@pytest.fixture(scope="session")
def other_template_drafter(
    cpu_python: Path, project: LoadedProject, vocab: Path, volumes: Volumes, built_target: Path
) -> dict[str, Any]:
    """Trained on features of the same conversations rendered with a Kimi-K2-shaped template
    (no thinking): the tokenizer it was pointed at carried another chat template."""
    share_data(volumes, project, "other-template", "vocab")
    variant = target_variant(built_target, volumes, "k2-template", "kimi_k2_shaped.jinja")
    overrides = ("train.drafter=other-template", "extract.backend=transformers")
    extract_reference(cpu_python, project, volumes, overrides, variant)
    return train(cpu_python, project, volumes, *overrides, target_path=variant)


@pytest.fixture(scope="session")
def other_target_drafter(
    cpu_python: Path, project: LoadedProject, vocab: Path, volumes: Volumes, built_target: Path
) -> dict[str, Any]:
    """Trained on the features of the checkpoint the served target continued from (same shape,
    same tokenizer and template, other weights)."""
    share_data(volumes, project, "other-target", "vocab")
    variant = target_variant(built_target, volumes, "previous", None)
    overrides = ("train.drafter=other-target", "extract.backend=transformers")
    extract_reference(cpu_python, project, volumes, overrides, variant)
    return train(cpu_python, project, volumes, *overrides, target_path=variant)


@pytest.fixture(scope="session")
def online_drafter(
    cpu_python: Path, project: LoadedProject, vocab: Path, volumes: Volumes
) -> dict[str, Any]:
    """Trained online (train.mode=online, one epoch) against a real vLLM started with the
    rendered sidecar flags; the trainer reads and deletes every file the server writes."""
    share_data(volumes, project, "online", "vocab")
    overrides = ("train.drafter=online", "train.mode=online", "train.epochs=1")
    rendered = pods.rendered(project, "train", overrides=overrides)
    assert rendered.vllm_model is not None
    port = pods.free_port()
    args = pods.cpu_vllm_args(rendered.vllm_args, "127.0.0.1", port)
    args = pods.localize(args, volumes.roots)
    started = time.monotonic()
    server = pods.start_vllm(cpu_python, str(volumes.local(rendered.vllm_model)), args,
                             volumes.root / "online-sidecar.log",
                             mounts=volumes.mounts(rendered, "train-online-sidecar"))  # fmt: skip
    try:
        pods.wait_ready([server])
        FIGURES["vLLM start-up, online sidecar (s)"] = round(time.monotonic() - started, 1)
        online_port = project.project.clusters["cpu"].workloads.train.online.port
        run = train(cpu_python, project, volumes, *overrides,
                    **{f"http://127.0.0.1:{online_port}": server.url})  # fmt: skip
    finally:
        server.stop()
    steps = run["progress"][-1]["step"] if run["progress"] else 0
    FIGURES["train (online): steps/s"] = round(steps / run["seconds"], 2)
    scratch = volumes.local(rendered.spec["online"]["storage_dir"])
    run["scratch_left"] = sorted(p.name for p in scratch.iterdir()) if scratch.is_dir() else []
    return run


@dataclass
class Served:
    drafter: str
    server: pods.Server
    bench: dict[str, Any]
    trained_prompts: dict[str, Any] | None = None
    """`good` only: vLLM's count on the very held-out prompts training judged it on."""
    metrics: tuple[str, str] = ("", "")
    """The server's /metrics just before and just after `bench` (the canary judge's input)."""


TRAINED_PROMPTS = "trained"
"""The bench prompt set written from `good`'s replay sample: the prompts of the held-out
conversations training judged, so its prediction is compared with vLLM's count like for like."""
TRAINED_PROMPTS_BENCH = (f"bench.prompt_sets=[{TRAINED_PROMPTS}]", "bench.num_prompts=256")


def write_trained_prompts(drafter: Path, volumes: Volumes) -> int:
    """The held-out conversations' prompts (the turns before the answer training judged) as a
    bench prompt file on the datasets volume."""
    rows = [json.loads(line) for line in (drafter / "replay-sample.jsonl").read_text().splitlines()]
    prompts = [{"messages": row["messages"], **({"tools": row["tools"]} if row.get("tools") else {})}
               for row in rows]  # fmt: skip
    write_rows(volumes.root / "data" / "prompts" / "heldout-trained.jsonl", prompts)
    return len(prompts)


def length(result: Served, prompt_set: str = "code", concurrency: int = 4) -> float:
    """The mean acceptance length vLLM counted for one bench level of a served drafter."""
    level = next(lv for lv in result.bench["levels"]
                 if lv["prompt_set"] == prompt_set and lv["concurrency"] == concurrency)  # fmt: skip
    value = level["mean_acceptance_length"]
    assert value is not None, level
    return float(value)


MODEL_FREE = ("ngram", "suffix")
"""The methods that need no drafter, served on the same target for the bake-off."""
SERVED_MISTAKES = ("untrained", "shifted", "other-template", "other-target")
"""Each known mistake, served next to the correct drafter (`good`)."""


@dataclass(frozen=True)
class ServeRequest:
    """One drafter served on one cluster profile of one config, with that cluster's volumes."""

    label: str
    loaded: LoadedProject
    drafter: str
    volumes: Volumes
    cluster: str = "cpu"


def serve_and_bench(cpu_python: Path, requests: list[ServeRequest]) -> dict[str, Served]:
    """Each drafter served with the rendered `--speculative-config` (all at once), benchmarked
    in turn, then stopped."""
    servers = {}
    started = time.monotonic()
    for req in requests:
        rendered = pods.rendered(req.loaded, "serve", req.drafter, cluster=req.cluster)
        servers[req.label], _ = req.volumes.start_serving(
            cpu_python, rendered, f"serve-{req.label}"
        )
    results = {}
    try:
        pods.wait_ready(list(servers.values()), timeout=900)
        FIGURES[f"vLLM start-up, {len(requests)} drafters at once (s)"] = round(
            time.monotonic() - started, 1
        )
        for req in requests:
            server = servers[req.label]
            before = scrape(server)
            measured = bench(cpu_python, req.loaded, req.volumes, req.drafter, server, req.cluster)
            results[req.label] = Served(
                req.drafter, server, measured, None, (before, scrape(server))
            )
            if req.label == "good":
                results[req.label].trained_prompts = bench(
                    cpu_python, req.loaded, req.volumes, req.drafter, server, req.cluster,
                    overrides=TRAINED_PROMPTS_BENCH,
                )  # fmt: skip
    finally:
        for server in servers.values():
            server.stop()
    return results


@pytest.fixture(scope="session")
def served(
    cpu_python: Path,
    project: LoadedProject,
    volumes: Volumes,
    target_server: pods.Server,
    good_drafter: dict[str, Any],
    untrained_drafter: dict[str, Any],
    shifted_drafter: Path,
    other_template_drafter: dict[str, Any],
    other_target_drafter: dict[str, Any],
    second_cluster: SecondCluster,
) -> dict[str, Served]:
    """The baseline bench on the non-speculative server, then the drafters in waves of servers
    (memory: each CPU vLLM holds about 4 GB); the second wave includes `good` served on the
    second cluster profile from the copy it pulled from the registry ("good@cpu-b"), the third
    the model-free methods (n-gram, suffix decoding) for the bake-off."""
    FIGURES["good: held-out prompts benched"] = write_trained_prompts(good_drafter["out"], volumes)
    before = scrape(target_server)
    baseline = bench(cpu_python, project, volumes, "none", target_server)
    results = {"none": Served("none", target_server, baseline, None,
                              (before, scrape(target_server)))}  # fmt: skip
    here = [ServeRequest(name, project, name, volumes) for name in ("good", "untrained", "shifted")]
    results.update(serve_and_bench(cpu_python, here))
    results.update(serve_and_bench(cpu_python, [
        ServeRequest(name, project, name, volumes) for name in ("other-template", "other-target")
    ] + [ServeRequest(PULLED, second_cluster.loaded, "good", second_cluster.volumes, "cpu-b")]))  # fmt: skip
    results.update(serve_and_bench(cpu_python, [
        ServeRequest(name, project, name, volumes) for name in MODEL_FREE
    ]))  # fmt: skip
    for name, result in results.items():
        level = result.bench["levels"][0]
        FIGURES[f"acceptance length, {name} (k=3, greedy, held-out code)"] = level.get(
            "mean_acceptance_length"
        )
    return results


def scrape(server: pods.Server) -> str:
    text: str = urllib.request.urlopen(f"{server.url}/metrics", timeout=30).read().decode()
    return text


def bench(cpu_python: Path, project: LoadedProject, volumes: Volumes, drafter: str,
          server: pods.Server, cluster: str = "cpu",
          overrides: tuple[str, ...] = ()) -> dict[str, Any]:  # fmt: skip
    return timed_bench(cpu_python, project, volumes, drafter, server, cluster, overrides)[0]


def timed_bench(cpu_python: Path, project: LoadedProject, volumes: Volumes, drafter: str,
                server: pods.Server, cluster: str = "cpu", overrides: tuple[str, ...] = (),
                ) -> tuple[dict[str, Any], str, float]:  # fmt: skip
    """The bench pod as rendered: its result, its stdout (the progress events) and its seconds."""
    rendered = pods.rendered(project, "bench", drafter, cluster=cluster, overrides=overrides)
    spec = volumes.spec(rendered, **service_urls(project, server, cluster))
    pod = f"bench-{cluster}-{drafter}" + ("-" + str(len(overrides)) if overrides else "")
    started = time.monotonic()
    code, out, err = pods.run_workload(cpu_python, "bench", spec, volumes.root,
                                       mounts=volumes.mounts(rendered, pod),
                                       **rendered.secret_env)  # fmt: skip
    seconds = time.monotonic() - started
    assert code == 0, err[-3000:]
    result: dict[str, Any] = pods.events(out, "result")[-1]
    return result, out, seconds


@pytest.fixture(scope="module")
def netns() -> Iterator[tuple[str, str]]:
    """(namespace name, its address): a veth pair, 10.213.N.1 here and 10.213.N.2 inside."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        if os.environ.get("KIMIDEPLOY_REQUIRE_PIPELINE") == "1":
            pytest.fail("a network namespace needs root and iproute2 (`ip`)")
        pytest.skip("a network namespace needs root and iproute2 (`ip`)")
    tag = secrets.token_hex(3)
    name, host, peer = f"kd-{tag}", f"kdh{tag}", f"kdn{tag}"
    subnet = 1 + int(tag, 16) % 250
    here, there = f"10.213.{subnet}.1", f"10.213.{subnet}.2"
    steps = [
        ["ip", "netns", "add", name],
        ["ip", "link", "add", host, "type", "veth", "peer", "name", peer],
        ["ip", "link", "set", peer, "netns", name],
        ["ip", "addr", "add", f"{here}/30", "dev", host],
        ["ip", "link", "set", host, "up"],
        ["ip", "netns", "exec", name, "ip", "addr", "add", f"{there}/30", "dev", peer],
        ["ip", "netns", "exec", name, "ip", "link", "set", peer, "up"],
        ["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"],
    ]
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True, text=True)
        yield name, there
    finally:
        subprocess.run(["ip", "link", "del", host], capture_output=True)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


@pytest.fixture(scope="module")
def pipeline_cluster() -> Iterator[harness.TestCluster]:
    """A control plane whose simulated node is the pipeline profile's (cluster `cpu`); it serves
    PodMonitors, so `up` renders one."""
    cluster = harness.up(config_path=CONFIG, bin_dir=_bin_dir())
    try:
        with served_pod_monitor_crd(cluster):
            yield cluster
    finally:
        harness.down(cluster.root)


def kd(cluster: harness.TestCluster, namespace: str, *args: str) -> int:
    """The CLI in-process, on the pipeline project, against this control plane and namespace."""
    before = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    try:
        command, rest = args[0], list(args[1:])
        return main(["--config", str(CONFIG), command, *rest, "--context", CONTEXT,
                     "--namespace", namespace])  # fmt: skip
    finally:
        if before is None:
            os.environ.pop("KUBECONFIG")
        else:
            os.environ["KUBECONFIG"] = before


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FIGURES:
        return
    terminalreporter.section("pipeline figures (real vLLM 0.32 on CPU)")
    for key, value in FIGURES.items():
        terminalreporter.write_line(f"{key:48} {value}")
    out = os.environ.get("KIMIDEPLOY_PIPELINE_FIGURES")
    if out:
        Path(out).write_text(json.dumps(FIGURES, indent=2))


def copy_drafter(run: dict[str, Any], where: Path) -> Path:
    target = where / run["out"].name
    shutil.copytree(run["out"], target)
    return target


PULLED = "good@cpu-b"
"""`good`, published from cluster cpu and served on cpu-b from the copy cpu-b's pod pulled."""


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[test_registry.TestRegistry]:
    """The real OCI registry (CNCF Distribution, TLS, htpasswd) drafters are published to."""
    try:
        started = test_registry.start(tmp_path_factory.mktemp("registry"))
    except test_registry.UnavailableError as exc:
        if _require():
            pytest.fail(f"the test registry could not be started: {exc}")
        pytest.skip(f"the test registry could not be started: {exc}")
    yield started
    started.stop()


@dataclass
class SecondCluster:
    """The project with the registry and a second profile (cpu-b: its own volumes), `good`
    pinned in it by `drafter publish`, and what cpu-b's serve pod pulled."""

    config: Path
    loaded: LoadedProject
    volumes: Volumes
    published: dict[str, Any]
    pulled: str


def registry_roots(where: Path, reg: test_registry.TestRegistry) -> dict[str, Path | str]:
    """The pod's registry Secret and CA mounts, as local folders holding what they would."""
    from kimideploy.config.specs import REGISTRY_MOUNT
    from kimideploy.plan.publish import CA_FILE, CA_MOUNT

    auth = reg.credentials(where / "auth").parent
    (where / "ca").mkdir(parents=True, exist_ok=True)
    shutil.copy(reg.ca, where / "ca" / CA_FILE)
    return {REGISTRY_MOUNT: auth, CA_MOUNT: where / "ca"}


def with_registry_and_second_profile(text: str, reg: test_registry.TestRegistry) -> str:
    """The pipeline config plus `registry:` (the test registry) and cluster cpu-b, a copy of cpu
    in its own namespace: what a user adds to serve on another cluster."""
    registry = (
        f"registry:\n  repository: {reg.host}/kimideploy\n  push_secret: registry-push\n"
        "  pull_secret: registry-pull\n  ca_secret: registry-ca\n  client:\n    oras: v1.3.6\n"
        "    builder: docker.io/library/golang:1.26@sha256:" + "0" * 64 + "\n\n"
    )
    head, clusters = text.split("clusters:\n", 1)
    second = clusters.replace("  cpu:\n", "  cpu-b:\n", 1).replace(
        "    namespace: pipeline\n", "    namespace: pipeline-b\n", 1
    )
    return (
        head.replace("drafters:\n", registry + "drafters:\n", 1) + "clusters:\n" + clusters + second
    )


@pytest.fixture(scope="session")
def second_cluster(
    cpu_python: Path, good_drafter: dict[str, Any], volumes: Volumes, target: Path,
    registry: test_registry.TestRegistry, tmp_path_factory: pytest.TempPathFactory,
) -> SecondCluster:  # fmt: skip
    """`drafter publish good --cluster cpu` as its pod runs it (the publish workload against the
    real registry, pinned into the config by the CLI's own code), then cpu-b's serve pod's
    artifact-pull into cpu-b's models volume. cpu-b's volumes hold the synced target and the
    bench prompts, as its own `host sync-model` and prompt upload would leave them."""
    from kimideploy.services.drafters.publishing import pin_published

    where = tmp_path_factory.mktemp("publishing")
    config = where / "kimideploy.yaml"
    config.write_text(with_registry_and_second_profile(CONFIG.read_text(), registry))
    roots = registry_roots(where, registry)
    loaded = load_project(config)
    oras = {"KIMIDEPLOY_ORAS": str(registry.oras)}
    rendered = pods.rendered(loaded, "publish", "good")
    spec = pods.localize(rendered.spec, {**volumes.roots, **roots})
    code, out, err = pods.run_workload(cpu_python, "publish", spec, where,
                                       mounts=volumes.mounts(rendered, "publish-good"), **oras)  # fmt: skip
    assert code == 0, err[-3000:]
    result = pods.events(out, "result")[-1]
    pin_published(config, "good", result)
    loaded = load_project(config)
    second = Volumes(tmp_path_factory.mktemp("cluster-b"))
    served_target = second.local(
        str(pods.rendered(loaded, "serve", "none", cluster="cpu-b").vllm_model)
    )
    shutil.copytree(target, served_target)
    shutil.copytree(volumes.root / "data" / "prompts", second.root / "data" / "prompts")
    serve = pods.rendered(loaded, "serve", "good", cluster="cpu-b")
    pull_spec = pods.localize(
        serve.spec, {**second.roots, **registry_roots(where / "pull", registry)}
    )
    code, _, err = pods.run_workload(cpu_python, "artifact-pull", pull_spec, where,
                                     mounts=second.mounts(serve, "serve-good-pull"), **oras)  # fmt: skip
    assert code == 0, err[-3000:]
    FIGURES["publish: bytes pushed, pull verified"] = f"{result['bytes']:,}, yes"
    return SecondCluster(config, loaded, second, result, pull_spec["pulls"][0]["dest"])
