"""From the rented cluster to the host that serves: a real OCI registry
(CNCF Distribution, TLS, htpasswd) and the real ORAS CLI, with the control plane applying what
kimideploy renders. The publish Job's pod is simulated there (KWOK), so its log is what the same
publish code printed when run here against the registry, as the pipeline tier runs workload code
directly; the serve pod's drafter-pull runs the same way.

Faults, each a clear error and nothing written to kimideploy.yaml: a push cut mid-blob (retried),
a tampered blob, a wrong digest in the config, refused or expired credentials, the registry down.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kimideploy.config.loading import load_project
from kimideploy.config.specs import PublishSpec, RegistryAccess, ServeSpec
from kimideploy.workloads.oci_artifacts import PULLED_MARKER, file_sha256
from tests import registry as test_registry
from tests.conftest import EXAMPLE, REPO
from tests.integration.conftest import harness

pytestmark = pytest.mark.integration
FAST = ("--poll", "0.2")


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[test_registry.TestRegistry]:
    try:
        started = test_registry.start(tmp_path_factory.mktemp("registry"))
    except test_registry.UnavailableError as exc:
        if os.environ.get("KIMIDEPLOY_REQUIRE_TESTCLUSTER") == "1":
            pytest.fail(f"the test registry could not be started: {exc}")
        pytest.skip(f"the test registry could not be started: {exc}")
    yield started
    started.stop()


def drafter_folder(where: Path, size: int = 2_000_000) -> Path:
    """A drafter as `run train` leaves it: config.json, weights, lineage with held-out figures."""
    from tests.unit.test_drafter_check import write_safetensors

    where.mkdir(parents=True, exist_ok=True)
    (where / "config.json").write_text(json.dumps({"architectures": ["Eagle3DraftModel"],
                                                   "eagle_aux_hidden_state_layer_ids": [2, 30, 58]}))  # fmt: skip
    write_safetensors(where / "model.safetensors", {"fc.weight": ("BF16", [size // 2])})
    lineage = {"drafter": "v4", "run_id": "a1b2c3", "trained_for": "moonshotai/Kimi-K2.5",
               "trained_for_revision": "3d2f1c0b9a8e7d6c5b4a39281706f5e4d3c2b1a0",
               "eagle_aux_hidden_state_layer_ids": [2, 30, 58], "draft_vocab_size": 32000,
               "num_speculative_tokens": 3, "dataset": {"fingerprint": "0af4dd1abf4e", "samples": 480},
               "selected_checkpoint": {"step": 900, "reason": "the last step has the best held-out mean acceptance length at k=3 (2.41)"},
               "held_out": {"depth": 3, "samples": 240, "mean_acceptance_length": {"1": 1.71, "2": 2.12, "3": 2.41},
                            "by_k": {"3": {"acceptance_per_position": [0.71, 0.58, 0.42]}}}}  # fmt: skip
    (where / "kimideploy-lineage.json").write_text(json.dumps(lineage))
    return where


def run_pod(workload: str, spec: Any, where: Path, oras: Path) -> subprocess.CompletedProcess[str]:
    """The pod's command, here: `python -m kimideploy.workloads WORKLOAD --spec ...`."""
    path = where / f"{workload}-spec.json"
    path.write_text(spec.model_dump_json())
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "KIMIDEPLOY_ORAS": str(oras)}
    return subprocess.run([sys.executable, "-m", "kimideploy.workloads", workload, "--spec", str(path)],
                          capture_output=True, text=True, env=env, timeout=300)  # fmt: skip


def registry_config(tmp_path: Path, reg: test_registry.TestRegistry) -> Path:
    """The example with a registry at the test one (its CA in a Secret)."""
    text = EXAMPLE.read_text().replace(
        "  repository: ghcr.io/kimideploy/artifacts   # EXAMPLE: drafters/NAME and datasets/NAME go below it\n",
        f"  repository: {reg.host}/kimideploy\n  ca_secret: kimideploy-registry-ca\n",
    )  # fmt: skip
    path = tmp_path / "kimideploy.yaml"
    path.write_text(text)
    return path


def access(
    reg: test_registry.TestRegistry, where: Path, password: str | None = None
) -> RegistryAccess:
    return RegistryAccess(config=str(reg.credentials(where, password)), ca_file=str(reg.ca))


def publish_spec(
    folder: Path, reg: test_registry.TestRegistry, where: Path, **changes: Any
) -> PublishSpec:
    values = {"run_id": "p1", "cluster": "b300", "kind": "drafter", "name": "v4",
              "source_dir": str(folder), "repository": f"{reg.host}/kimideploy/drafters/v4",
              "tag": "run-p1", "annotations": {"io.kimideploy.target": "moonshotai/Kimi-K2.5"},
              "registry": access(reg, where / "push"),
              "target": {"repo": "moonshotai/Kimi-K2.5", "revision": "0" * 40, "served_name": "k",
                         "path": "/models/x", "num_hidden_layers": 61, "hidden_size": 7168,
                         "vocab_size": 163840}, **changes}  # fmt: skip
    return PublishSpec.model_validate(values)


def test_publish_then_serve_anywhere_from_the_digest(
    kd: Callable[..., tuple[int, str, str]], testcluster: harness.TestCluster, namespace: str,
    registry: test_registry.TestRegistry, tmp_path: Path,
) -> None:  # fmt: skip
    """`drafter publish v4 --cluster b300` on the control plane, with the push the publish pod does
    (run here against the real registry); kimideploy.yaml then pins v4 by digest, and `up serve
    --drafter v4` on rtx6000 renders a serve pod whose first init container pulls and verifies
    it (run here too): the files are the ones published."""
    folder = drafter_folder(tmp_path / "b300-models" / "drafters" / "v4")
    pushed = run_pod("publish", publish_spec(folder, registry, tmp_path), tmp_path, registry.oras)
    assert pushed.returncode == 0, pushed.stderr
    harness.serve_logs(testcluster, namespace, harness.write_container_log(
        tmp_path / "publish.log", pushed.stdout.splitlines()))  # fmt: skip
    config = registry_config(tmp_path, registry)
    text = config.read_text()
    config.write_text(text.replace("      base_drafter: v1\n      dataset: datasets/synthetic-v3\n",
                                   "      base_drafter: v1\n      dataset: datasets/synthetic-v3\n"
                                   "  v4:\n    source: {path: drafters/v4}\n    aux_layer_ids: [2, 30, 58]\n"
                                   "    layer_id_convention: vllm\n    status: planned   # until published\n"
                                   "    lineage: {trained_for: moonshotai/Kimi-K2.5}\n"))  # fmt: skip
    before = config.read_text()
    for secret in ("kimideploy-registry-push", "kimideploy-registry-pull"):
        testcluster.kubectl("-n", namespace, "create", "secret", "docker-registry", secret,
                            f"--docker-server={registry.host}", "--docker-username=x", "--docker-password=y")  # fmt: skip
    testcluster.kubectl("-n", namespace, "create", "secret", "generic", "kimideploy-registry-ca",
                        f"--from-file=ca.crt={registry.ca}")  # fmt: skip
    code, out, err = kd("drafter", "publish", "v4", "--cluster", "b300", *FAST, config=config)
    assert code == 0, err
    digest = json.loads(pushed.stdout.splitlines()[-1])["digest"]
    assert out.strip() == f"{registry.host}/kimideploy/drafters/v4@{digest}"
    assert "drafters.v4 updated in" in err and "held-out k=1 1.71, k=2 2.12, k=3 2.41" in err
    after = config.read_text()
    project = load_project(config).project
    v4 = project.drafters["v4"]
    assert v4.source.oci is not None and v4.source.oci.digest == digest and v4.status == "trained"
    assert v4.held_out is not None and v4.held_out.mean_acceptance_length[3] == 2.41
    assert set(v4.source.oci.files) == {
        "config.json",
        "model.safetensors",
        "kimideploy-lineage.json",
    }
    # Only v4's lines changed; every other line (comments included) is as it was.
    changed = [line for line in after.splitlines() if line not in before.splitlines()]
    assert all(
        line.startswith(("    source:", "    status:", "    sha256:", "    held_out:"))
        for line in changed
    ), changed
    # Serve it on another cluster: the pod pulls it first, with the pull Secret and the CA.
    code, out, err = kd(
        "up", "serve", "--drafter", "v4", "--cluster", "rtx6000", "--dry-run", config=config
    )
    assert code == 0, err
    from kimideploy.plan.model import PlanRequest
    from kimideploy.services.rendering import render_workload

    rendered = render_workload(load_project(config), PlanRequest("serve", "rtx6000", "v4"))
    pod = next(o for o in rendered.objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    names = [c["name"] for c in pod["initContainers"]]
    assert names[0] == "artifact-pull" and names.index("drafter-check") > 0
    pull = pod["initContainers"][0]
    assert {"name": "models", "mountPath": "/models"} in pull["volumeMounts"]  # writable here only
    main = pod["containers"][0]
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in main["volumeMounts"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert secrets == {
        "registry-auth": "kimideploy-registry-pull",
        "registry-ca": "kimideploy-registry-ca",
    }
    spec = ServeSpec.model_validate(rendered.plan.spec.model_dump())
    assert [p.kind for p in spec.pulls] == ["drafter"] and spec.drafter_path == spec.pulls[0].dest
    local = tmp_path / "rtx6000-models"
    pulled = spec.pulls[0].model_copy(update={
        "dest": str(local / Path(spec.pulls[0].dest).relative_to("/models")),
        "registry": access(registry, tmp_path / "pull")})  # fmt: skip
    here = spec.model_copy(update={"pulls": [pulled]})
    done = run_pod("artifact-pull", here, tmp_path, registry.oras)
    assert done.returncode == 0, done.stderr
    assert "pulled and verified" in done.stderr
    for name in ("config.json", "model.safetensors", "kimideploy-lineage.json"):
        assert (Path(pulled.dest) / name).read_bytes() == (folder / name).read_bytes()
    again = run_pod("artifact-pull", here, tmp_path, registry.oras)
    assert again.returncode == 0 and "already on the volume (same digest)" in again.stderr
    # The drafter keeps where it was trained, so no `run train` writes that name again.
    assert v4.source.path == "drafters/v4"
    code, _, err = kd("run", "train", "--cluster", "b300", "--drafter", "v4", "--detach",
                      config=config)  # fmt: skip
    assert code == 2 and "drafter v4 is published" in err


class CuttingProxy(threading.Thread):
    """TCP in front of the registry that drops the first connection carrying more than
    `budget` bytes upstream: a push cut mid-blob."""

    def __init__(self, upstream: str, budget: int) -> None:
        super().__init__(daemon=True)
        host, port = upstream.split(":")
        self.upstream, self.budget, self.cut = (host, int(port)), budget, False
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.host = f"127.0.0.1:{self.listener.getsockname()[1]}"

    def run(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self.relay, args=(client,), daemon=True).start()

    def relay(self, client: socket.socket) -> None:
        server = socket.create_connection(self.upstream)
        cut = not self.cut

        def down() -> None:
            try:
                while data := server.recv(65536):
                    client.sendall(data)
            except OSError:
                pass  # the cut closed both ends

        threading.Thread(target=down, daemon=True).start()
        sent = 0
        try:
            while data := client.recv(65536):
                sent += len(data)
                if cut and sent > self.budget:
                    self.cut = True
                    break
                server.sendall(data)
        except OSError:
            pass
        client.close()
        server.close()


def test_a_push_cut_mid_blob_is_retried_and_lands_whole(
    registry: test_registry.TestRegistry, tmp_path: Path
) -> None:
    proxy = CuttingProxy(registry.host, budget=1_000_000)
    proxy.start()
    folder = drafter_folder(tmp_path / "v4", size=6_000_000)
    creds = tmp_path / "through-proxy"  # not "push": publish_spec writes the direct one there
    creds.mkdir()
    (creds / ".dockerconfigjson").write_text(
        test_registry.docker_config(proxy.host, registry.user, registry.password)
    )
    spec = publish_spec(folder, registry, tmp_path, repository=f"{proxy.host}/kimideploy/drafters/v4",
                        registry=RegistryAccess(config=str(creds / ".dockerconfigjson"), ca_file=str(registry.ca)))  # fmt: skip
    done = run_pod("publish", spec, tmp_path, registry.oras)
    assert done.returncode == 0, done.stderr
    assert proxy.cut and "push attempt 1 failed" in done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    pulled = run_pod_pull(result["reference"].replace(proxy.host, registry.host), result["files"],
                          registry, tmp_path)  # fmt: skip
    assert pulled.returncode == 0, pulled.stderr


def run_pod_pull(reference: str, files: dict[str, str], reg: test_registry.TestRegistry, where: Path,
                 password: str | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
    spec = ServeSpec.model_validate({
        "run_id": "serve", "cluster": "rtx6000", "drafter": "v4", "drafter_path": "/models/x",
        "layers": None, "num_speculative_tokens": 3, "image_cuda_archs": [], "vllm_version": "0.32.0",
        "target": {"repo": "m/k", "revision": "0" * 40, "served_name": "k", "path": "/models/x",
                   "num_hidden_layers": 61, "hidden_size": 7168, "vocab_size": 163840},
        "pulls": [{"kind": "drafter", "name": "v4", "reference": reference,
                   "dest": str(where / "pulled" / reference[-12:]), "files": files,
                   "registry": access(reg, where / "pullcreds", password).model_dump()}],
    })  # fmt: skip
    return run_pod("artifact-pull", spec, where, reg.oras)


@pytest.fixture(scope="module")
def published(
    registry: test_registry.TestRegistry, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    where = tmp_path_factory.mktemp("published")
    folder = drafter_folder(where / "v4", size=3_000_000)
    done = run_pod(
        "publish", publish_spec(folder, registry, where, tag="faults"), where, registry.oras
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize(
    ("fault", "message", "code"),
    [
        ("wrong digest", "is not in the registry: a wrong digest, or never published", 2),
        ("bad credentials", "the registry refused the credentials", 2),
        ("changed checksum", "differ from what was published", 2),
    ],
)
def test_pull_faults_fail_the_pod_in_seconds_naming_the_reason(
    registry: test_registry.TestRegistry, published: dict[str, Any], tmp_path: Path,
    fault: str, message: str, code: int,
) -> None:  # fmt: skip
    reference, files, password = published["reference"], dict(published["files"]), None
    if fault == "wrong digest":
        reference = reference[:-6] + "000000"
    if fault == "bad credentials":
        password = "expired-or-wrong"
    if fault == "changed checksum":
        files["config.json"] = "0" * 64
    done = run_pod_pull(reference, files, registry, tmp_path, password)
    assert done.returncode == code, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert not list((tmp_path / "pulled").glob("*/*")) if (tmp_path / "pulled").exists() else True


def test_a_pulled_drafter_is_verified_at_every_start_not_trusted_by_its_marker(
    registry: test_registry.TestRegistry, published: dict[str, Any], tmp_path: Path
) -> None:
    """Files replaced after a real pull, a planted extra file (dot-names included), a folder
    forged with a marker before the first pull, a marker that does not parse: each is pulled
    again into a fresh folder, and the pod serves exactly the published bytes."""
    reference, files = published["reference"], dict(published["files"])
    dest = tmp_path / "pulled" / reference[-12:]

    def start() -> subprocess.CompletedProcess[str]:
        done = run_pod_pull(reference, files, registry, tmp_path)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        assert {n: file_sha256(dest / n) for n in files} == files
        return done

    assert "pulled and verified" in start().stderr
    assert "every file re-verified" in start().stderr
    (dest / "config.json").write_text('{"auto_map": {"AutoModel": "evil.Model"}}')
    again = start()
    assert "pulling again: files config.json differ" in again.stderr
    (dest / ".evil.py").write_text("import os\n")
    again = start()
    assert "files .evil.py differ" in again.stderr and not (dest / ".evil.py").exists()
    marker = json.loads((dest / PULLED_MARKER).read_text())
    shutil.rmtree(dest)
    dest.mkdir()
    (dest / PULLED_MARKER).write_text(json.dumps(marker))  # forged before any pull
    for name in files:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_text("planted")
    assert "pulling again" in start().stderr
    (dest / PULLED_MARKER).write_text("{not json")
    assert "a marker that does not parse means not pulled" in start().stderr


def test_a_lineage_of_the_wrong_shape_stops_the_publish_before_the_push(
    registry: test_registry.TestRegistry, tmp_path: Path
) -> None:
    folder = drafter_folder(tmp_path / "v4", size=100_000)
    lineage = json.loads((folder / "kimideploy-lineage.json").read_text())
    lineage["held_out"] = {"mean_acceptance_length": [1.5, 2.0]}
    (folder / "kimideploy-lineage.json").write_text(json.dumps(lineage))
    spec = publish_spec(folder, registry, tmp_path, tag="bad-lineage")
    blobs = len(registry.blob_files())
    done = run_pod("publish", spec, tmp_path, registry.oras)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "held_out in the lineage has the wrong shape" in done.stderr
    assert "nothing was pushed" in done.stderr
    assert len(registry.blob_files()) == blobs  # ORAS never ran


def test_a_tampered_blob_and_a_registry_that_is_down(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """On a registry of its own (these break it): a blob changed in storage is caught by ORAS's
    digest check; a registry that is not there is named as unreachable."""
    reg = test_registry.start(tmp_path / "registry")
    try:
        folder = drafter_folder(tmp_path / "v4", size=3_000_000)
        done = run_pod("publish", publish_spec(folder, reg, tmp_path, repository=f"{reg.host}/k/drafters/v4"),
                       tmp_path, reg.oras)  # fmt: skip
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout.splitlines()[-1])
        blob = next(b for b in reg.blob_files() if b.stat().st_size > 2_000_000)
        blob.write_bytes(b"\0" * blob.stat().st_size)
        tampered = run_pod_pull(result["reference"], result["files"], reg, tmp_path)
        assert tampered.returncode == 2 and "does not match its digest" in tampered.stderr
    finally:
        reg.stop()
    down = run_pod_pull(result["reference"], result["files"], reg, tmp_path)
    assert down.returncode == 1 and "cannot reach the registry" in down.stderr


def test_a_failed_publish_writes_nothing_to_the_config(
    kd: Callable[..., tuple[int, str, str]], testcluster: harness.TestCluster, namespace: str,
    registry: test_registry.TestRegistry, tmp_path: Path,
) -> None:  # fmt: skip
    """The push is refused (the publish pod exits 2 naming the credentials): the Job fails at
    once (exit 2 is not retried: the same Secret would be refused again), the run fails (exit
    4) and kimideploy.yaml is byte for byte what it was."""
    folder = drafter_folder(tmp_path / "v4")
    refused = run_pod("publish", publish_spec(folder, registry, tmp_path,
                                              registry=access(registry, tmp_path / "bad", "nope")),
                      tmp_path, registry.oras)  # fmt: skip
    assert refused.returncode == 2 and "refused the credentials" in refused.stderr
    harness.serve_logs(testcluster, namespace, harness.write_container_log(
        tmp_path / "publish.log", refused.stderr.splitlines()))  # fmt: skip
    config = registry_config(tmp_path, registry)
    before = config.read_text()
    testcluster.kubectl("-n", namespace, "create", "secret", "docker-registry", "kimideploy-registry-push",
                        f"--docker-server={registry.host}", "--docker-username=x", "--docker-password=y")  # fmt: skip
    failing = ('publish.pod_annotations={"kimideploy.test/run-duration": "1s", '
               '"kimideploy.test/fail-index": "0", "kimideploy.test/fail-exit-code": "2"}')  # fmt: skip
    code, _, err = kd(
        "drafter", "publish", "v3", "--cluster", "rtx6000", "--set", failing, *FAST, config=config
    )
    assert code == 4, err
    assert "refused the credentials" in err  # the pod's log tail
    pods = json.loads(testcluster.kubectl("-n", namespace, "get", "pods", "-l",
                                          "app.kubernetes.io/component=publish", "-o", "json"))  # fmt: skip
    assert len(pods["items"]) == 1, "a bad-input exit was retried"
    assert config.read_text() == before


def conversations_folder(where: Path, samples: int = 40) -> tuple[Path, str]:
    """Conversations as a datagen run leaves them: shards of chunk files and the fingerprint."""
    from kimideploy.workloads import dataset_record

    fields = {"stage": "datagen", "target": {"repo": "moonshotai/Kimi-K2.5", "revision": "0" * 40},
              "prompts": "prompts/chat.jsonl", "endpoint": "serve",
              "sampling": {"max_tokens": 512, "temperature": 0.0, "top_p": 1.0}, "shards": 2}  # fmt: skip
    record = dataset_record.claim(where, fields, {"prompts_sha256": "ab" * 32})
    for shard in range(2):
        chunk = where / f"shard-{shard:05d}" / "chunk-00000.jsonl"
        chunk.parent.mkdir(parents=True, exist_ok=True)
        chunk.write_text("".join(
            json.dumps({"id": f"s{shard}-{i}", "messages": [{"role": "user", "content": "hi"}]}) + "\n"
            for i in range(samples // 2)))  # fmt: skip
    return where, str(record["id"])


def test_conversations_published_on_one_cluster_feed_another_pipeline(
    kd: Callable[..., tuple[int, str, str]], testcluster: harness.TestCluster, namespace: str,
    registry: test_registry.TestRegistry, tmp_path: Path,
) -> None:  # fmt: skip
    """`data publish chat-v3 --cluster b300` pins the conversations (digest, fingerprint, what made
    them) as datasets.chat-v3; rtx6000's pipeline names them, its extract Job pulls them first
    (into datasets/published/<digest>, fingerprint checked) and extracts from there; its datagen
    is refused (nothing to generate); a pulled folder whose fingerprint is not the pinned one is
    not kept."""
    from kimideploy.plan.model import PlanRequest
    from kimideploy.services.rendering import render_workload

    folder, made_id = conversations_folder(tmp_path / "b300-datasets" / "conversations")
    spec = publish_spec(folder, registry, tmp_path, kind="conversations", name="chat-v3",
                        repository=f"{registry.host}/kimideploy/datasets/chat-v3",
                        annotations={"io.kimideploy.made-for-drafter": "v3"})  # fmt: skip
    pushed = run_pod("publish", spec, tmp_path, registry.oras)
    assert pushed.returncode == 0, pushed.stderr
    result = json.loads(pushed.stdout.splitlines()[-1])
    assert result["dataset"] == {"fingerprint": made_id, "samples": 40,
                                 "made_from": json.loads((folder / "fingerprint.json").read_text())["fields"]}  # fmt: skip
    assert not list(folder.glob("shard-*/.writer.lock"))  # the publish held and released them
    harness.serve_logs(testcluster, namespace, harness.write_container_log(
        tmp_path / "publish.log", pushed.stdout.splitlines()))  # fmt: skip
    config = registry_config(tmp_path, registry)
    testcluster.kubectl("-n", namespace, "create", "secret", "docker-registry", "kimideploy-registry-push",
                        f"--docker-server={registry.host}", "--docker-username=x", "--docker-password=y")  # fmt: skip
    testcluster.kubectl("-n", namespace, "create", "secret", "generic", "kimideploy-registry-ca",
                        f"--from-file=ca.crt={registry.ca}")  # fmt: skip
    before = config.read_text()
    code, out, err = kd("data", "publish", "chat-v3", "--cluster", "b300", *FAST, config=config)
    assert code == 0, err
    assert out.strip() == result["reference"]
    assert "datasets.chat-v3 added to" in err and "40 conversations" in err
    assert config.read_text().startswith(before.rstrip("\n"))  # appended; nothing else changed
    project = load_project(config).project
    chat = project.datasets["chat-v3"]
    assert chat.fingerprint == made_id and chat.made_on == "b300" and chat.made_for == "v3"
    # rtx6000's pipeline takes them: its extract Job pulls first, then reads the pulled folder.
    rendered = render_workload(load_project(config), PlanRequest(
        "extract", "rtx6000", None, ("train.conversations=chat-v3",)))  # fmt: skip
    job = next(o for o in rendered.objects if o["kind"] == "Job")
    pod = job["spec"]["template"]["spec"]
    assert pod["initContainers"][0]["name"] == "artifact-pull"
    assert {"name": "datasets", "mountPath": "/data"} in pod["initContainers"][0]["volumeMounts"]
    extract = rendered.plan.spec
    digest = chat.oci.digest.removeprefix("sha256:")
    assert extract.conversations_dir == f"/data/published/{digest}"  # type: ignore[attr-defined]
    assert extract.fingerprint["conversations"] == made_id  # type: ignore[attr-defined]
    pulled = extract.pulls[0].model_copy(update={
        "dest": str(tmp_path / "rtx6000-datasets" / "published" / digest),
        "registry": access(registry, tmp_path / "pull")})  # fmt: skip
    done = run_pod("artifact-pull", extract.model_copy(update={"pulls": [pulled]}), tmp_path,
                   registry.oras)  # fmt: skip
    assert done.returncode == 0, done.stderr
    got = sorted(str(p.relative_to(pulled.dest)) for p in Path(pulled.dest).rglob("*.jsonl"))
    assert got == ["shard-00000/chunk-00000.jsonl", "shard-00001/chunk-00000.jsonl"]
    code, _, err = kd("run", "datagen", "--cluster", "rtx6000", "--detach",
                      "--set", "train.conversations=chat-v3", config=config)  # fmt: skip
    assert code == 2 and "takes its conversations from the published dataset chat-v3" in err
    # A pulled folder whose fingerprint is not the pinned one is refused and not kept.
    wrong = pulled.model_copy(update={"fingerprint": "0" * 12,
                                      "dest": str(tmp_path / "elsewhere" / digest)})  # fmt: skip
    refused = run_pod("artifact-pull", extract.model_copy(update={"pulls": [wrong]}), tmp_path,
                      registry.oras)  # fmt: skip
    assert refused.returncode == 2 and f"its fingerprint.json says {made_id}" in refused.stderr
    assert not Path(wrong.dest).exists()


def test_a_rented_cluster_says_what_its_volumes_hold_unpublished(
    kd: Callable[..., tuple[int, str, str]], testcluster: harness.TestCluster, namespace: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    """b300 rented until tomorrow: `status` and `run` warn and list its train drafter and its
    pipeline's conversations with the command that publishes each; once both are published
    (the config pins them), nothing is listed."""
    from datetime import UTC, datetime, timedelta

    ends = (datetime.now(UTC) + timedelta(hours=20)).strftime("%Y-%m-%dT%H:%M:%SZ")
    config = tmp_path / "kimideploy.yaml"
    text = EXAMPLE.read_text()
    config.write_text(text.replace(
        "  b300:\n", f"  b300:\n    rental: {{ends: '{ends}', provider: Example GPU Cloud}}\n", 1))  # fmt: skip
    code, out, err = kd("status", "--cluster", "b300", config=config)
    assert code == 0, err
    assert "warning: cluster b300 is rented: its volumes go with it, the rental ends in 20 h" in err
    assert "kimideploy drafter publish v3 --cluster b300" in err
    assert "kimideploy data publish NAME --cluster b300" in err
    assert "if made: no finished train run seen in 7 days" in err
    code, out, _ = kd("status", "--cluster", "b300", "-o", "json", config=config)
    report = json.loads(out)
    assert report["rental"]["warn"] is True and len(report["rental"]["unpublished"]) == 2
    code, _, err = kd("run", "vocab", "--cluster", "b300", "--detach", config=config)
    assert code == 0, err
    assert "warning: cluster b300 is rented" in err


def published_v4(config: Path, result: dict[str, Any]) -> None:
    """Register v4 in the config as `drafter publish` pins it: source.oci, status trained."""
    repository, _, digest = str(result["reference"]).rpartition("@")
    files = ", ".join(f"{name}: {sha}" for name, sha in sorted(result["files"].items()))
    text = config.read_text()
    config.write_text(text.replace(
        "      base_drafter: v1\n      dataset: datasets/synthetic-v3\n",
        "      base_drafter: v1\n      dataset: datasets/synthetic-v3\n"
        f"  v4:\n    source: {{oci: {{repository: {repository}, digest: '{digest}', files: {{{files}}}}}}}\n"
        "    aux_layer_ids: [2, 30, 58]\n    layer_id_convention: vllm\n    status: trained\n"
        "    lineage: {trained_for: moonshotai/Kimi-K2.5}\n"))  # fmt: skip


def test_host_sync_model_fetches_published_drafters_with_the_serve_pods_own_pull(
    kd: Callable[..., tuple[int, str, str]], testcluster: harness.TestCluster, namespace: str,
    registry: test_registry.TestRegistry, published: dict[str, Any], sshd: Any, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """On the PCIe host: `host sync-model --cluster rtx6000` downloads the model and the hub drafters over
    SSH, then runs a pull Job on the host's cluster for the published drafter: the serve pod's
    artifact-pull (serve image, pull Secret, CA, the same destination), whose log here is what
    that code printed when run against the real registry. `drafter pull` again finds it there
    by digest; a drafter that is not published is refused before anything is created."""
    from kimideploy.config.specs import PullSpec
    from kimideploy.plan.model import PlanRequest
    from kimideploy.services.rendering import render_workload
    from tests.integration.hub import Hub

    config = registry_config(tmp_path, registry)
    published_v4(config, published)
    host = (f"      - {{name: gpu-host, address: 127.0.0.1, port: {sshd.port}, user: {sshd.user}, "
            f"identity_file: {sshd.user_key}, known_hosts: {sshd.known_hosts}}}")  # fmt: skip
    text = config.read_text()
    for old, new in (
        ("      - {name: gpu-host, address: 192.0.2.10, user: ops}   # EXAMPLE: your host's address", host),
        ("      model_path: /mnt/nvme/models ", f"      model_path: {tmp_path}/nvme/models "),
    ):  # fmt: skip
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    config.write_text(text)
    project = load_project(config).project
    model = project.model_for("rtx6000")
    hub = Hub(model.repo, model.revision, {"config.json": b'{"model_type": "kimi_k25"}\n'},
              "hf_test", lfs=set())  # fmt: skip
    for drafter in project.eagle_drafters.values():
        if drafter.source.hub is not None:
            hub.add_repo(drafter.source.hub.repo, drafter.source.hub.revision,
                         {"config.json": b'{"architectures": ["LlamaForCausalLMEagle3"]}\n'})  # fmt: skip
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    for secret in ("kimideploy-registry-pull",):
        testcluster.kubectl("-n", namespace, "create", "secret", "docker-registry", secret,
                            f"--docker-server={registry.host}", "--docker-username=x", "--docker-password=y")  # fmt: skip
    testcluster.kubectl("-n", namespace, "create", "secret", "generic", "kimideploy-registry-ca",
                        f"--from-file=ca.crt={registry.ca}")  # fmt: skip
    # The pull pod's work, done here against the registry with the spec the plan renders.
    rendered = render_workload(load_project(config), PlanRequest("pull", "rtx6000", "v4"))
    spec = PullSpec.model_validate(rendered.plan.spec.model_dump())
    assert [(p.name, p.reference) for p in spec.pulls] == [("v4", published["reference"])]
    local = tmp_path / "rtx6000-models"
    pulled = spec.pulls[0].model_copy(update={
        "dest": str(local / Path(spec.pulls[0].dest).relative_to("/models")),
        "registry": access(registry, tmp_path / "pull")})  # fmt: skip
    done = run_pod("artifact-pull", spec.model_copy(update={"pulls": [pulled]}), tmp_path,
                   registry.oras)  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["pulled"][0]["state"] == "pulled"
    result["pulled"][0]["dest"] = spec.pulls[0].dest  # as the pod on the host reports it
    harness.serve_logs(testcluster, namespace, harness.write_container_log(
        tmp_path / "pull.log", [json.dumps(result)]))  # fmt: skip

    code, _, err = kd("host", "sync-model", "--cluster", "rtx6000", *FAST, config=config)
    hub.stop()
    assert code == 0, err
    models = tmp_path / "nvme" / "models"
    assert (models / "hub" / model.repo / model.revision / ".kimideploy-complete").is_file()
    assert "published drafters v4: pulled by a Job on rtx6000" in err
    assert f"drafter v4: {published['reference']} pulled at {spec.pulls[0].dest}" in err
    jobs = json.loads(testcluster.kubectl("-n", namespace, "get", "jobs", "-l",
                                          "app.kubernetes.io/component=pull", "-o", "json"))["items"]  # fmt: skip
    assert len(jobs) == 1
    pod = jobs[0]["spec"]["template"]["spec"]
    assert "initContainers" not in pod or not pod["initContainers"]
    container = pod["containers"][0]
    assert container["name"] == "pull" and container["args"][0] == "artifact-pull"
    assert container["image"] == project.images[project.clusters["rtx6000"].images.serve].reference
    assert {"name": "models", "mountPath": "/models"} in container["volumeMounts"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert secrets == {"registry-auth": "kimideploy-registry-pull",
                       "registry-ca": "kimideploy-registry-ca"}  # fmt: skip
    for name in published["files"]:
        assert (Path(pulled.dest) / name).is_file()

    # The second time the volume has it: the pull reports it present and fetches nothing.
    again = run_pod("artifact-pull", spec.model_copy(update={"pulls": [pulled]}), tmp_path,
                    registry.oras)  # fmt: skip
    assert (
        again.returncode == 0
        and json.loads(again.stdout.splitlines()[-1])["pulled"][0]["state"] == "present"
    )
    harness.write_container_log(tmp_path / "pull.log", again.stdout.splitlines())  # KWOK rereads
    code, out, err = kd("drafter", "pull", "v4", "--cluster", "rtx6000", "-o", "json", *FAST,
                        config=config)  # fmt: skip
    assert code == 0, err
    assert json.loads(out)[0]["state"] == "present"

    # Not published: refused with the way to get it there, before any object is created.
    before = testcluster.kubectl("-n", namespace, "get", "jobs", "-o", "name")
    code, _, err = kd("drafter", "pull", "v3", "--cluster", "rtx6000", config=config)
    assert code == 2 and "drafter v3 comes from a cluster's volume" in err
    assert "kimideploy drafter publish v3 --cluster CLUSTER" in err
    code, _, err = kd("drafter", "pull", "k25", "--cluster", "rtx6000", config=config)
    assert code == 2 and "comes from the hub" in err and "host sync-model" in err
    assert testcluster.kubectl("-n", namespace, "get", "jobs", "-o", "name") == before
