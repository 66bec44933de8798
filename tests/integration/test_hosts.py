"""Fabric, Ansible and the host commands against a real sshd on 127.0.0.1."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kimideploy.cli.main import main
from kimideploy.config.loading import LoadedProject, load_project
from kimideploy.errors import KimiDeployError
from kimideploy.provision.inventory import inventory, playbook_for
from kimideploy.provision.runner import run_playbook
from kimideploy.remote.fabric_runner import FabricRunner, SshTarget
from kimideploy.remote.runner import RemoteError, SudoError
from kimideploy.services.hosts.model_sync import sync_model
from kimideploy.services.hosts.provision import check_hosts
from kimideploy.services.reporting import SilentReporter
from tests.conftest import REPO
from tests.integration.gpu_machine import Machine, install
from tests.integration.hub import Hub
from tests.integration.mirror import Mirror, build_mirror
from tests.integration.sshd import start_sshd

pytestmark = pytest.mark.integration
ANSIBLE = REPO / "ansible"
HOST_LINE = (
    "      - {name: gpu-host, address: 192.0.2.10, user: ops}   # EXAMPLE: your host's address"
)
B300_LINE = "      - {name: b300-0, address: 198.51.100.30, user: ubuntu}"


def runner(sshd: Any, **changes: Any) -> FabricRunner:
    target = {"host": "test", "address": "127.0.0.1", "port": sshd.port, "user": sshd.user,
              "identity_file": str(sshd.user_key), "known_hosts": str(sshd.known_hosts), **changes}  # fmt: skip
    return FabricRunner(SshTarget(**target))


def ssh_host(sshd: Any, name: str) -> str:
    return (f"      - {{name: {name}, address: 127.0.0.1, port: {sshd.port}, user: {sshd.user}, "
            f"identity_file: {sshd.user_key}, known_hosts: {sshd.known_hosts}}}")  # fmt: skip


@pytest.fixture
def host_config(sshd: Any, edited_config: Callable[..., Path], tmp_path: Path) -> Iterator[Path]:
    yield from _config_for(sshd, edited_config, tmp_path)


def _config_for(sshd: Any, edited_config: Callable[..., Path], tmp_path: Path,
                *more: tuple[str, str]) -> Iterator[Path]:  # fmt: skip
    mirror = Mirror(build_mirror(tmp_path / "mirror", "v1.33.5+k3s1"))
    mirrors = (f"      mirrors: {{cuda_repo: {mirror.url}/cuda, container_toolkit_repo: {mirror.url}/toolkit, "
               f"k3s_releases: {mirror.url}/k3s}}\n")  # fmt: skip
    yield edited_config(
        (HOST_LINE, ssh_host(sshd, "gpu-host")),
        (B300_LINE, ssh_host(sshd, "b300-0")),
        ("      model_path: /mnt/nvme/models ", f"      model_path: {tmp_path}/nvme/models "),
        (
            "      storage_path: /mnt/nvme/k3s-storage\n",
            f"      storage_path: {tmp_path}/nvme/k3s\n",
        ),
        (
            "      device_plugin_version: v0.17.4\n",
            "      device_plugin_version: v0.17.4\n" + mirrors,
        ),
        *more,
    )
    mirror.stop()


@pytest.fixture
def machine_config(
    edited_config: Callable[..., Path], tmp_path: Path
) -> Iterator[Callable[[Machine], Path]]:
    """A config whose hosts are an sshd in front of a GPU machine's tools (gpu_machine.py)."""
    servers: list[Any] = []
    configs: list[Iterator[Path]] = []

    def make(machine: Machine) -> Path:
        root = tmp_path / f"machine-{len(servers)}"
        server = start_sshd(root / "sshd", install(root, machine))
        servers.append(server)
        # One node is enough: the second's documentation address costs a connect timeout.
        one_node = ("      - {name: b300-1, address: 198.51.100.31, user: ubuntu}\n", "")
        configs.append(_config_for(server, edited_config, root, one_node))
        return next(configs[-1])

    yield make
    for config in configs:
        next(config, None)
    for server in servers:
        server.stop()


# --- Fabric -------------------------------------------------------------------------------------


def test_commands_are_quoted_and_exit_codes_returned(sshd: Any) -> None:
    remote = runner(sshd)
    result = remote.run(["echo", "a b; echo injected", "$HOME"])
    assert result.ok and result.stdout == "a b; echo injected $HOME\n"
    assert remote.run(["sh", "-c", "echo err >&2; exit 7"]).exit_code == 7
    assert remote.run(["cat"], stdin="from stdin\n").stdout == "from stdin\n"
    remote.close()


def test_a_build_streams_over_ssh_as_it_prints(sshd: Any) -> None:
    """`image build --cluster CLUSTER` runs for hours: its lines (stderr folded in, as the build
    script does) reach the caller as they are printed, not when the command ends."""
    import time

    from kimideploy.images.build import Watch

    remote = runner(sshd)
    arrived: list[tuple[float, str]] = []
    started = time.monotonic()
    steps: list[str] = []
    watch = Watch(steps.append, lambda line: arrived.append((time.monotonic() - started, line)))
    script = ("exec 2>&1; echo '#5 [builder 2/6] RUN apt-get update'; sleep 3; "
              "echo '#5 DONE 3.0s' >&2; echo '#6 [builder 3/6] COPY x y'")  # fmt: skip
    result = remote.run_streaming(["sh", "-c", script], watch)
    remote.close()
    assert result.ok and [line for _, line in arrived][1] == "#5 DONE 3.0s"
    # Measured between the lines, not from the call: connecting and authenticating took 2 s on a
    # loaded machine. Lines held until the command ends would arrive together; streamed ones
    # arrive the script's 3 s sleep apart, less however late the first one was delivered.
    assert arrived[1][0] - arrived[0][0] > 1.5, arrived
    assert steps == ["[builder 2/6] RUN apt-get update", "[builder 3/6] COPY x y"]


def test_file_transfer_both_ways(sshd: Any, tmp_path: Path) -> None:
    local = tmp_path / "up.txt"
    local.write_text("payload\n")
    remote = runner(sshd)
    remote.put(local, str(tmp_path / "remote.txt"))
    remote.get(str(tmp_path / "remote.txt"), tmp_path / "back.txt")
    assert (tmp_path / "back.txt").read_text() == "payload\n"
    remote.close()


def test_unknown_host_key_is_refused(sshd: Any, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(
        RemoteError, match=r"the host key is not in .*; refusing to connect"
    ) as info:
        runner(sshd, known_hosts=str(empty)).run(["true"])
    assert "ssh-keyscan" in (info.value.hint or "")


def test_authentication_failure(sshd: Any, tmp_path: Path) -> None:
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    with pytest.raises(RemoteError, match="authentication failed"):
        runner(sshd, identity_file=str(stranger)).run(["true"])


def test_unreachable_host(sshd: Any) -> None:
    from tests.integration.sshd import _free_port

    with pytest.raises(RemoteError, match="unreachable"):
        runner(sshd, port=_free_port(), connect_timeout=3).run(["true"])


def test_missing_sudo_is_reported(sshd: Any) -> None:
    with pytest.raises(SudoError, match="cannot use sudo without a password"):
        runner(sshd).run(["true"], sudo=True)


# --- Ansible ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "playbook", sorted((ANSIBLE / "playbooks").glob("*.yml")), ids=lambda p: p.name
)
def test_playbook_syntax(playbook: Path) -> None:
    result = subprocess.run(
        [str(REPO / ".venv" / "bin" / "ansible-playbook"), "--syntax-check", "-i", "localhost,", str(playbook)],
        capture_output=True, text=True, cwd=ANSIBLE, env={"ANSIBLE_CONFIG": str(ANSIBLE / "ansible.cfg"), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_ansible_lint_production_profile() -> None:
    result = subprocess.run(
        [str(REPO / ".venv" / "bin" / "ansible-lint"), "--profile", "production", "--offline", "playbooks", "roles"],
        capture_output=True, text=True, cwd=ANSIBLE,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_inventory_from_the_example_config(example: LoadedProject) -> None:
    inv = inventory(example.project, "rtx6000")
    host = inv["all"]["hosts"]["gpu-host"]
    assert (
        host["ansible_host"] == "192.0.2.10"
        and host["ansible_user"] == "ops"
        and host["ansible_become"]
    )
    assert "StrictHostKeyChecking=yes" in host["ansible_ssh_common_args"]
    variables = inv["all"]["vars"]
    assert variables["gpu_host_nvidia_driver_version"] == "580.95.05"
    assert variables["gpu_host_node_labels"] == {
        "nvidia.com/gpu.product": "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition"
    }
    assert variables["gpu_host_models_claim"] == "kimi-k25-models"
    assert variables["gpu_host_pod_uid"] == 10001  # drafters/ is theirs: training writes there
    nvl8 = inventory(example.project, "b300")["all"]["vars"]
    assert (
        nvl8["nvl8_node_min_driver_version"] == "580.65.06" and nvl8["nvl8_node_expected_gpus"] == 8
    )
    assert set(inventory(example.project, "b300")["all"]["hosts"]) == {"b300-0", "b300-1"}


def test_gpu_host_playbook_in_check_mode_changes_nothing(host_config: Path, tmp_path: Path) -> None:
    project = load_project(host_config).project
    lines: list[tuple[str, str]] = []
    result = run_playbook(playbook_for(project.clusters["rtx6000"]), inventory(project, "rtx6000"),
                          check=True, tags=[], on_line=lambda kind, text: lines.append((kind, text)))  # fmt: skip
    assert result.ok, result.failures
    recap = result.recap["gpu-host"]
    assert recap["failed"] == 0 and recap["changed"] > 0 and recap["ok"] >= recap["changed"]
    assert set(recap) == {"ok", "changed", "unreachable", "failed", "skipped", "rescued", "ignored"}
    kinds = {kind for kind, _ in lines}
    assert {"task", "ok", "changed"} <= kinds and not kinds & {"fatal", "unreachable"}
    assert (
        "task",
        "gpu_host : Install the pinned k3s binary, verified against the release checksums",
    ) in lines
    assert (
        "task",
        "gpu_host : Give the pods' user the drafters folder of the models volume",
    ) in lines
    assert not (tmp_path / "nvme").exists()  # check mode: the directories were not created
    assert not Path("/etc/rancher/k3s/config.yaml").exists()


def test_provision_tags_limit_the_run(
    host_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "--config",
            str(host_config),
            "host",
            "provision",
            "--cluster",
            "rtx6000",
            "--check",
            "--tags",
            "toolkit",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "toolkit" in err and "k3s" not in err.replace("gpu-host", "")
    assert "HOST" in out and "gpu-host" in out


def test_nvl8_playbook_stops_on_a_node_without_a_driver(
    host_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["--config", str(host_config), "host", "provision", "--cluster", "b300", "--check"])
    _, err = capsys.readouterr()
    assert code == 4
    assert "this node has no working NVIDIA driver; the provider must install it" in err
    # ansible-runner's events name the host, the task (with its role) and Ansible's own message.
    assert (
        "fatal: [b300-0]: nvl8_node : Require a working NVIDIA driver: nvidia-smi did not run"
        in err
    )
    assert "unreachable: [b300-1]: Gathering Facts: " in err  # a documentation address


COMPUTE = {f"mlx5_{i}": ("ACTIVE", "InfiniBand") for i in range(8)}
BESIDE = {"mlx5_8": ("DOWN", "Ethernet"), "mlx5_9": ("DOWN", "InfiniBand")}
"""A front-end NIC and a storage HCA beside the compute HCAs, down on a healthy node."""


def _provision(config: Path, cluster: str, *tags: str) -> tuple[Any, list[tuple[str, str]]]:
    project = load_project(config).project
    lines: list[tuple[str, str]] = []
    result = run_playbook(playbook_for(project.clusters[cluster]), inventory(project, cluster),
                          check=True, tags=list(tags), on_line=lambda kind, text: lines.append((kind, text)))  # fmt: skip
    return result, lines


def test_nvl8_role_reads_the_compute_hcas_only(machine_config: Callable[[Machine], Path]) -> None:
    """A node whose front-end and storage NICs are down passes; its compute HCAs are what count."""
    result, _ = _provision(machine_config(Machine(ib_ports={**COMPUTE, **BESIDE})), "b300")
    assert result.recap["b300-0"]["failed"] == 0, result.failures
    down = {**COMPUTE, "mlx5_3": ("DOWN", "InfiniBand"), **BESIDE}
    result, _ = _provision(machine_config(Machine(ib_ports=down)), "b300")
    failure = next(f for f in result.failures if f.startswith("fatal: [b300-0]"))
    assert "Require every compute HCA's port ACTIVE" in failure and "mlx5_3 1 DOWN" in failure
    assert "mlx5_8" not in failure and "mlx5_9" not in failure


def test_nvl8_role_refuses_a_gpu_whose_fabric_registration_failed(
    machine_config: Callable[[Machine], Path],
) -> None:
    fabric = [("Completed", "Success")] * 6 + [("Completed", "Insufficient Resources"),
                                                ("Completed", "Success")]  # fmt: skip
    config = machine_config(Machine(ib_ports={**COMPUTE, **BESIDE}, fabric=fabric))
    result, _ = _provision(config, "b300")
    failure = next(f for f in result.failures if f.startswith("fatal: [b300-0]"))
    assert "Require every GPU registered with the fabric" in failure
    assert "00000000:BA:00.0|Completed|Insufficient Resources" in failure


def test_host_check_reads_a_node_as_nccl_will_use_it(
    machine_config: Callable[[Machine], Path],
) -> None:
    fabric = (
        [("Completed", "Success")] * 5 + [("In Progress", "N/A")] + [("Completed", "Success")] * 2
    )
    config = machine_config(Machine(ib_ports={**COMPUTE, **BESIDE}, fabric=fabric))
    checks = {
        c.name: c for c in check_hosts(load_project(config).project, "b300", only="b300-0")[0][1]
    }
    assert checks["InfiniBand"].ok and checks["InfiniBand"].detail == "8/8 compute HCA ports ACTIVE"
    assert checks["fabric manager"].ok  # running: and still one GPU did not register
    registration = checks["GPU fabric registration"]
    assert not registration.ok and registration.detail == "00000000:AB:00.0 In Progress/N/A"
    assert checks["GPU topology"].detail.startswith("28 NV18 GPU pairs; every pair over NVLink")


def test_gpu_host_role_sets_peer_to_peer_and_check_mode_shows_the_diff(
    machine_config: Callable[[Machine], Path], tmp_path: Path
) -> None:
    rtx = Machine(name="NVIDIA RTX PRO 6000 Blackwell Server Edition", compute_cap="12.0",
                  memory_mib=97887, bar1_mib=131072, link="SYS", acs_redirecting=True)  # fmt: skip
    config = machine_config(rtx)
    result, lines = _provision(config, "rtx6000", "p2p")
    assert result.ok, result.failures
    diffs = "\n".join(text for kind, text in lines if kind == "diff")
    assert '+GRUB_CMDLINE_LINUX_DEFAULT="${GRUB_CMDLINE_LINUX_DEFAULT} iommu=pt"' in diffs
    assert "+options nvidia_uvm uvm_disable_hmm=1" in diffs
    assert "+ExecStart=/usr/local/sbin/kimideploy-acs-off" in diffs
    notes = [text for kind, text in lines if kind == "message"]
    assert any("not yet in effect: kernel parameter iommu=pt; nvidia_uvm uvm_disable_hmm=1" in n
               for n in notes), notes  # fmt: skip
    assert not Path("/etc/default/grub.d/90-kimideploy-iommu.cfg").exists()  # check mode
    # The same host read back by `host check`: what the running kernel lacks, named.
    checks = {c.name: c for c in check_hosts(load_project(config).project, "rtx6000")[0][1]}
    assert checks["PCIe ACS"].status == "FAIL" and checks["PCIe ACS"].detail.startswith(
        "redirection on at 4 bridges (15:00.0, 16:01.0, 97:00.0, 98:01.0)"
    )
    assert checks["IOMMU"].status == "warn" and "wants iommu=pt" in checks["IOMMU"].detail
    assert checks["BAR1"].ok and checks["GPU topology"].detail.startswith("28 SYS GPU pairs")


def test_gpu_host_role_refuses_a_small_bar1(machine_config: Callable[[Machine], Path]) -> None:
    rtx = Machine(name="NVIDIA RTX PRO 6000 Blackwell Server Edition", compute_cap="12.0",
                  memory_mib=97887, bar1_mib=256, link="PIX")  # fmt: skip
    result, _ = _provision(machine_config(rtx), "rtx6000", "p2p")
    failure = next(f for f in result.failures if f.startswith("fatal: [gpu-host]"))
    assert "Require BAR1 to cover each GPU's memory" in failure
    assert "00000000:18:00.0 memory 97887 MiB, BAR1 256 MiB" in failure
    assert "Resizable BAR" in failure


# --- host check and sync-model over SSH ---------------------------------------------------------


def test_host_check_over_ssh_on_a_machine_without_gpus(
    host_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = check_hosts(load_project(host_config).project, "rtx6000", only="gpu-host")
    checks = {c.name: c for c in results[0][1]}
    assert not checks["nvidia-smi"].ok and "install the driver" in checks["nvidia-smi"].fix
    # the probe really ran df on the model path (this machine's disk, not the host's 7 TB NVMe)
    assert checks["free space"].detail.endswith("nvme/models, need 654 GB")
    code = main(
        [
            "--config",
            str(host_config),
            "host",
            "check",
            "--cluster",
            "rtx6000",
            "--host",
            "gpu-host",
            "-o",
            "json",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 1 and "blocking check(s) failed" in err
    assert '"check": "nvidia-smi"' in out and '"status": "FAIL"' in out


@pytest.fixture
def hub(host_config: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Hub]:
    project = load_project(host_config).project
    files = {"config.json": b'{"model_type": "kimi_k25"}\n', "model-00001.safetensors": bytes(range(256)) * 4096,
             "nested/tokenizer.model": b"tok" * 1000}  # fmt: skip
    server = Hub(project.model.repo, project.model.revision, files, "hf_secret_test_token",
                 lfs={"model-00001.safetensors"})  # fmt: skip
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_TOKEN", "hf_secret_test_token")
    yield server
    server.stop()


def test_sync_model_downloads_verifies_and_marks(
    host_config: Path, hub: Hub, tmp_path: Path
) -> None:
    project = load_project(host_config).project
    reporter = SilentReporter()
    sync_model(project, "rtx6000", reporter, drafters=False)
    dest = tmp_path / "nvme" / "models" / "hub" / project.model.repo / project.model.revision
    for name, data in hub.files.items():
        assert (dest / name).read_bytes() == data
    assert (dest / ".kimideploy-complete").is_file()
    assert any("verified in" in line for line in reporter.lines)
    assert all(auth == "Bearer hf_secret_test_token" for _, _, auth in hub.requests)
    before = len(hub.requests)
    sync_model(project, "rtx6000", SilentReporter(), drafters=False)
    assert [
        p for p, _, _ in hub.requests[before:] if "/resolve/" in p
    ] == []  # nothing downloaded twice


def test_an_interrupted_download_resumes(host_config: Path, hub: Hub, tmp_path: Path) -> None:
    project = load_project(host_config).project
    hub.drop_once.add("model-00001.safetensors")
    with pytest.raises(KimiDeployError, match=r"run the same command again|failed"):
        sync_model(project, "rtx6000", SilentReporter(), drafters=False)
    sync_model(project, "rtx6000", SilentReporter(), drafters=False)
    ranges = [r for p, r, _ in hub.requests if p.endswith("model-00001.safetensors") and r]
    assert ranges and ranges[-1].startswith("bytes=") and ranges[-1] != "bytes=0-"
    dest = tmp_path / "nvme" / "models" / "hub" / project.model.repo / project.model.revision
    assert (dest / "model-00001.safetensors").read_bytes() == hub.files["model-00001.safetensors"]


def test_a_corrupt_file_is_rejected_and_removed(
    host_config: Path, hub: Hub, tmp_path: Path
) -> None:
    project = load_project(host_config).project
    hub.corrupt.add("model-00001.safetensors")
    with pytest.raises(KimiDeployError, match="exit 3") as info:
        sync_model(project, "rtx6000", SilentReporter(), drafters=False)
    assert "sha256" in info.value.message
    dest = tmp_path / "nvme" / "models" / "hub" / project.model.repo / project.model.revision
    assert (
        not (dest / "model-00001.safetensors").exists()
        and not (dest / ".kimideploy-complete").exists()
    )


def test_a_refused_token(host_config: Path, hub: Hub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "wrong")
    with pytest.raises(KimiDeployError, match="refused the token"):
        sync_model(load_project(host_config).project, "rtx6000", SilentReporter(), drafters=False)


def test_a_command_that_exits_before_reading_its_input_returns_its_status(sshd: Any) -> None:
    """A remote command that ends without reading what is being sent to it (a script that stops
    early, a probe that fails at once) returns its own exit status: the bytes still in flight
    have nowhere to go, and that is not the command's failure. Input a command reads arrives
    whole and at once (Invoke alone sends a non-terminal stream a byte per 10 ms: a day for
    these 8 MiB)."""
    unread = "x" * (8 << 20)  # far more than the channel's window: the writer is still sending
    ssh = runner(sshd)
    try:
        for _ in range(3):
            result = ssh.run(["sh", "-c", "exit 7"], stdin=unread, timeout=60)
            assert result.exit_code == 7, result
        result = ssh.run_script("echo early; exit 3\n" + "#" * (8 << 20), timeout=60)
        assert (result.exit_code, result.stdout) == (3, "early\n"), result
        result = ssh.run(["sh", "-c", "wc -c"], stdin=unread, timeout=60)
        assert (result.exit_code, result.stdout.strip()) == (0, str(8 << 20)), result
    finally:
        ssh.close()
