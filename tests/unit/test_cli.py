"""The CLI as a user drives it (click's runner plus the real error boundary)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner

from kimideploy.cli.main import cli, main
from tests.conftest import EXAMPLE, REPO


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_render_serve_to_stdout_is_pipeable_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "render", "serve", "--drafter", "v3")
    assert code == 0
    kinds = [d["kind"] for d in yaml.safe_load_all(out)]
    # Two claims: the models, and the compile cache (kernels kept per image digest).
    assert kinds == ["NetworkPolicy", "ConfigMap", "ConfigMap", "PersistentVolumeClaim",
                     "PersistentVolumeClaim", "Service", "Deployment"]  # fmt: skip
    assert out == (REPO / "k8s/rendered/rtx6000/serve-v3.yaml").read_text()


def test_render_to_a_directory_writes_one_file_per_object(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run(
        capsys, "render", "train", "--cluster", "b200", "--dir", str(tmp_path / "out")
    )
    assert code == 0
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files[0].startswith("01-networkpolicy-") and files[1].startswith("02-configmap-")
    assert files[-1].startswith("09-job-kimi-k25-train-")
    assert len(files) == 9  # five claims (the compile cache among them), a Service, the Job
    assert all(
        len(list(yaml.safe_load_all((tmp_path / "out" / f).read_text()))) == 1 for f in files
    )
    assert str(tmp_path / "out" / files[0]) in err


def test_up_dry_run_prints_the_plan_and_touches_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "up", "serve", "--drafter", "v3", "--dry-run")
    assert code == 0
    assert "Plan: serve on rtx6000, drafter v3" in out
    assert '"method": "eagle3", "model": "/models/drafters/v3", "num_speculative_tokens": 3' in out
    assert "Recreate (8 GPUs cannot hold 2 copies of 8)" in out
    assert "with --gate: keep only at >= 1.10x output tokens/s over no drafter at c=1,8" in out
    assert "Deployment/kimi-k25-serve" in out
    assert "Dry run (client): nothing was sent to a cluster." in out


def test_the_printed_break_even_and_gate_follow_at_concurrency(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One rule for the gate's levels: the plan `up --gate --at-concurrency 4` prints shows the
    break-even and the gate at c=4, not at the config's levels (1 and 8)."""
    _, plain, _ = run(capsys, "up", "serve", "--drafter", "v3", "--dry-run")
    assert "break-even acceptance length c=1 " in plain and "at c=1,8," in plain
    code, out, _ = run(capsys, "up", "serve", "--drafter", "v3", "--dry-run", "--gate",
                       "--at-concurrency", "4")  # fmt: skip
    assert code == 0
    predicted = next(line for line in out.splitlines() if line.strip().startswith("predicted"))
    assert "break-even acceptance length c=4 " in predicted and "c=1 " not in predicted
    assert "over no drafter at c=4, else roll back" in out


def test_up_dry_run_shows_warnings(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "up", "serve", "--drafter", "v2", "--dry-run=client")
    assert "! drafter v2 drafts 5 tokens" in out


def test_drafter_list_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "drafter", "list")
    assert code == 0
    header = out.splitlines()[0].split()
    assert header[:7] == [
        "NAME",
        "METHOD",
        "SOURCE",
        "TOKENS",
        "LAYER_IDS",
        "CONVENTION",
        "VLLM_IDS",
    ]
    code, out, _ = run(capsys, "drafter", "list", "-o", "json")
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["v1"]["convention"] == "sglang" and rows["v1"]["vllm_ids"] == [3, 31, 59]
    assert rows["v3"]["source"] == "volume:drafters/v3"


def test_config_schema_is_json_schema_of_the_project(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "config", "schema")
    schema = json.loads(out)
    assert code == 0 and schema["title"] == "kimideploy.yaml"
    assert schema["additionalProperties"] is False
    assert {"model", "clusters", "drafters", "images"} <= set(schema["properties"])


def test_config_validate(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--config", str(EXAMPLE), "config", "validate")
    assert code == 0 and "valid (3 clusters, 4 images, 7 drafters)" in out
    # Valid, and it says what `up` and the dry runs would refuse: each placeholder pin by line.
    assert "15 of the example's placeholder pins remain" in out
    assert f"{EXAMPLE}:15: model.revision" in out
    code, out, _ = run(capsys, "--config", str(EXAMPLE), "config", "validate", "-o", "json")
    pins = json.loads(out)["placeholder_pins"]
    assert len(pins) == 15 and {"path": "model.revision", "line": 15} in pins


def test_default_config_is_local_file_then_builtin_example(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, "config", "validate")
    assert code == 0 and str(EXAMPLE) in out
    local = tmp_path / "kimideploy.yaml"
    local.write_text(EXAMPLE.read_text().replace("name: kimi-k25 ", "name: other "))
    code, out, _ = run(capsys, "render", "serve")
    assert code == 0 and "name: other-serve" in out


def test_help_lists_the_commands() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for command in ("render", "up", "drafter", "config"):
        assert command in result.output
    assert "2 usage or config error" in result.output


def test_every_listed_command_loads_and_help_imports_none_of_them() -> None:
    import click

    from kimideploy.cli.main import COMMANDS

    ctx = click.Context(cli)
    for name, (_, summary) in COMMANDS.items():
        command = cli.get_command(ctx, name)
        assert command is not None and command.name == name, name
        assert command.get_short_help_str(limit=200) == summary
    assert cli.get_command(ctx, "deploy") is None
    probe = (
        "import sys; from kimideploy.cli.main import main; main(['--help']); "
        "print(sorted(m for m in sys.modules if m.startswith('kimideploy.cli.')))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    loaded = done.stdout.strip().splitlines()[-1]
    assert not any(f"kimideploy.cli.{module}'" in loaded for module, _ in COMMANDS.values()), loaded


def test_unknown_command_and_bad_workload_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "deploy")[0] == 2
    code, _, err = run(capsys, "render", "servr")
    assert code == 2 and "servr" in err


def test_debug_shows_the_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    from kimideploy.errors import UsageError

    with pytest.raises(UsageError):
        main(["--debug", "render", "serve", "--drafter", "v9"])


@pytest.mark.parametrize("args", [("run", "train", "--baseline"), ("run", "bench", "--detach",
                                                                   "--baseline", "abc123")])  # fmt: skip
def test_baseline_is_for_a_followed_bench_run_only(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...]
) -> None:
    code, _, err = run(capsys, *args)
    assert code == 2 and "--baseline compares a bench run that this command follows" in err


def every_command(command: click.Command, ctx: click.Context, path: str = "kimideploy") -> Any:
    """(path, command) of every command under `command`, groups walked."""
    yield path, command
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            assert sub is not None, name
            yield from every_command(sub, ctx, f"{path} {name}")


def test_a_cluster_is_always_named_with_cluster() -> None:
    """One vocabulary: every option that names a cluster is spelled --cluster (image build's
    --on is kept as its old spelling beside it)."""
    ctx = click.Context(cli)
    odd = [f"{path}: {'/'.join(param.opts)}"
           for path, command in every_command(cli, ctx) for param in command.params
           if isinstance(param, click.Option) and "cluster" in (param.name or "")
           and "--cluster" not in param.opts]  # fmt: skip
    assert odd == []


def test_local_inputs_are_checked_before_the_cluster(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A missing prompt file or auth file, or an auth file without the registry's entry, is
    named before any cluster is reached (no kubeconfig here: reaching one would fail on that)."""
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    missing = tmp_path / "prompts.jsonl"
    code, _, err = run(capsys, "data", "put", str(missing), "--cluster", "rtx6000")
    assert code == 2 and "prompts.jsonl" in err and "does not exist" in err
    assert "kubeconfig" not in err.lower()
    code, _, err = run(capsys, "prepare", "--cluster", "rtx6000", "--registry-auth", str(missing))
    assert code == 2 and "does not exist" in err and "kubeconfig" not in err.lower()
    other_registry = tmp_path / "auth.json"
    other_registry.write_text('{"auths": {"quay.io": {"auth": "eDp5"}}}')
    code, _, err = run(
        capsys, "prepare", "--cluster", "rtx6000", "--dry-run", "--registry-auth",
        str(other_registry),
    )  # fmt: skip
    assert code != 0 and "--registry-auth" in err and "quay.io" in err
    assert "kubeconfig" not in err.lower()
