"""The lifecycle with real vLLM 0.32 on CPU: what a user of each stage would check.

Fixtures (conftest.py) run every stage once per session through kimideploy's rendering and the
workloads' entry points; these tests read what the stages left behind.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import REPO
from tests.pipeline import pods
from tests.pipeline.conftest import CONFIG, HERE, Served, copy_drafter, length
from tests.pipeline.figures import FIGURES

from kimideploy.formats.bench_result import BenchResult
from kimideploy.formats.chat_template import SAMPLE_FORMAT, generated_turn
from kimideploy.services.gate.verdict import GateMeasurementError, judge

SAMPLES = 480  # tests/pipeline/kimideploy.yaml: datagen.samples


def test_datagen_against_real_vllm_serve_writes_every_sample_with_its_reasoning(
    conversations: dict[str, Any],
) -> None:
    result = conversations["result"]
    assert result["samples"] == SAMPLES and result["failed_requests"] == 0, result
    out = Path(conversations["spec"]["output_dir"])
    samples = [json.loads(line) for chunk in sorted(out.glob("shard-*/chunk-*.jsonl"))
               for line in chunk.read_text().splitlines() if line]  # fmt: skip
    assert len(samples) == SAMPLES
    # vLLM's kimi_k2 reasoning parser split <think>...</think> from the answer; datagen put both
    # back in the format the target sees.
    with_reasoning = [s for s in samples if s["reasoning"].strip()]
    assert len(with_reasoning) >= 0.9 * SAMPLES, samples[0]
    assert all(s["format"] == SAMPLE_FORMAT for s in samples)
    # A turn that ended on its own has an answer. One that reached max_tokens inside its thinking
    # (a greedy repetition loop of this small target; CPU batching decides which prompt, so it
    # varies between runs: 1 of 480 in the fresh CI of 78b8b7c) is kept as it was generated, with
    # its finish reason, as serving would have returned it.
    assert all(s["answer"] for s in samples if s["finish_reason"] == "stop"), samples[0]
    truncated = [s for s in samples if not s["answer"]]
    assert all(s["finish_reason"] == "length" for s in truncated), truncated[:1]
    assert len(truncated) <= 0.02 * SAMPLES, len(truncated)


def test_vllm_extraction_equals_the_reference_backend_at_the_declared_layers(
    cpu_python: Path, features: dict[str, Any]
) -> None:
    manifest = features["manifest"]
    assert manifest["convention"] == "vllm" and manifest["vllm_layer_ids"] == [2, 3, 4]
    assert manifest["backend"] == "vllm" and manifest["final_layer"] == "pre-norm"
    done = subprocess.run([str(cpu_python), str(HERE / "compare_features.py"), str(features["vllm"]),
                           str(features["reference"])], capture_output=True, text=True,
                          env=pods.cpu_env(cpu_python), timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    compared = json.loads(done.stdout.splitlines()[-1])
    FIGURES["extract: vLLM vs reference, max rel. error"] = f"{compared['max_relative_error']:.1e}"
    assert compared["samples"] == SAMPLES and compared["same_names"], compared
    assert compared["problems"] == [], compared
    assert compared["max_relative_error"] < 1e-4, compared  # float32 on both sides
    # Nothing of vLLM's connector is left: every file and its lock were read and removed.
    assert not list(features["vllm"].glob("**/*.lock"))
    for scratch in features["vllm"].glob("shard-*/.vllm-hidden-states"):
        assert list(scratch.iterdir()) == []


def test_offline_training_learns_and_writes_what_vllm_reads(good_drafter: dict[str, Any]) -> None:
    progress = good_drafter["progress"]
    assert progress[-1]["loss"] < progress[0]["loss"] * 0.7, (progress[0], progress[-1])
    config = json.loads((good_drafter["out"] / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 3, 4]
    assert config["draft_vocab_size"] == 512


def test_online_training_against_the_rendered_sidecar_reads_and_deletes_every_file(
    online_drafter: dict[str, Any],
) -> None:
    progress = online_drafter["progress"]
    assert progress[-1]["loss"] < progress[0]["loss"] * 0.7, (progress[0], progress[-1])
    assert online_drafter["scratch_left"] == []  # no hidden states and no lock files left
    lineage = json.loads((online_drafter["out"] / "kimideploy-lineage.json").read_text())
    assert lineage["dataset"]["mode"] == "online"
    assert lineage["eagle_aux_hidden_state_layer_ids"] == [2, 3, 4]
    # The held-out samples were requested from the server too, and judged.
    assert lineage["held_out"]["samples"] >= 1 and lineage["held_out"]["mean_acceptance_length"]


def drafter_check(name: str, folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kimideploy", "--config", str(CONFIG), "drafter",
                           "check", name, "--dir", str(folder)],
                          capture_output=True, text=True, cwd=REPO, timeout=120)  # fmt: skip


def test_drafter_check_refuses_the_off_by_one_drafter_before_serving(
    good_drafter: dict[str, Any], shifted_drafter: Path, tmp_path: Path
) -> None:
    good = drafter_check("good", copy_drafter(good_drafter, tmp_path / "g"))
    assert good.returncode == 0, good.stdout + good.stderr
    assert "held-out mean acceptance length" in good.stdout  # its lineage's judgement, shown
    # Recorded as SGLang [2, 3, 4] = vLLM [3, 4, 5], trained on vLLM [2, 3, 4]: the lineage says so.
    shifted = drafter_check("shifted", shifted_drafter)
    assert shifted.returncode != 0
    assert "trained on vLLM layers [2, 3, 4], registry [3, 4, 5]" in shifted.stdout
    # And as SpecForge writes SGLang ids into config.json: the exact fix is named.
    spec_forge = tmp_path / "s"
    shutil.copytree(shifted_drafter, spec_forge)
    config = json.loads((spec_forge / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"] = [2, 3, 4]
    (spec_forge / "config.json").write_text(json.dumps(config))
    written = drafter_check("shifted", spec_forge)
    assert "config.json says [2, 3, 4]; trained at [3, 4, 5] in vLLM's convention" in written.stdout
    assert '"eagle_aux_hidden_state_layer_ids": [3, 4, 5]' in written.stdout


def test_the_gate_judges_the_real_counters_with_the_code_up_gate_uses(
    served: dict[str, Served],
) -> None:
    baseline = served["none"].bench
    assert all(lv["acceptance_rate"] is None for lv in baseline["levels"])
    good, plain = BenchResult.from_dict(served["good"].bench), BenchResult.from_dict(baseline)
    keep, reason, rows = judge(good, plain, [("code", 4)], 0.0)
    assert keep, reason
    assert [r["mean_acceptance_length"] for r in rows] == [length(served["good"])]
    # The serve plan asked vLLM 0.32 for each response's own acceptance, and the bench counted
    # those; with no other traffic in a level's window they equal what /metrics counted.
    for level in served["good"].bench["levels"]:
        assert level["metrics"] == "requests", level
        assert level["acceptance_rate"] == pytest.approx(level["scraped_acceptance_rate"]), level
    # A server without a drafter has no spec-decode counters: the gate refuses to guess.
    with pytest.raises(GateMeasurementError, match="counters are missing"):
        judge(plain, plain, [("code", 4)], 1.0)


def test_the_serve_release_with_an_api_key_refuses_v1_without_it_and_keeps_probes_open(
    target_server: pods.Server, project: Any
) -> None:
    """serve.api_key as rendered: vLLM got VLLM_API_KEY from the Secret reference, datagen and the
    bench (which ran above) sent it, and the paths the probes and Prometheus use stay open."""
    rendered = pods.rendered(project, "serve", "none")
    key = rendered.secret_env["VLLM_API_KEY"]
    assert rendered.ready_path == "/health"  # a probe cannot send a key

    def status(path: str, key: str | None = None) -> int:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        request = urllib.request.Request(target_server.url + path, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    assert status("/v1/models") == 401
    assert status("/v1/models", "a-wrong-key") == 401
    assert status("/v1/models", key) == 200
    assert status("/health") == 200 and status("/metrics") == 200


LOOKUP = {"type": "function", "function": {"name": "lookup", "description": "Find a fact.",
                                           "parameters": {"type": "object", "properties": {
                                               "topic": {"type": "string"}}}}}  # fmt: skip
CALL = {"id": "functions.lookup:0", "type": "function",
        "function": {"name": "lookup", "arguments": '{"topic": "batching"}'}}  # fmt: skip
RENDERED_BOTH_WAYS = [
    # A plain chat: the template adds its default system turn.
    {"messages": [{"role": "user", "content": "In a few sentences, explain batching."}]},
    # The user's own system turn instead.
    {"messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Think step by step: what is 12 * 13 - 100?"}]},
    # Tools declared, and the generated turn calls one.
    {"messages": [{"role": "user", "content": "Look up batching."}], "tools": [LOOKUP],
     "tool_calls": [CALL]},
    # Several turns: the earlier turn's thinking is dropped by the template, the last one's kept.
    {"messages": [{"role": "user", "content": "Explain caching."},
                  {"role": "assistant", "content": "caching keeps results.",
                   "reasoning": "the engineer asks about caching."},
                  {"role": "user", "content": "And batching?"}]},
    # An agent's step: a tool call and its result, then the answer (interleaved thinking kept).
    {"messages": [{"role": "user", "content": "Look up batching."},
                  {"role": "assistant", "content": "", "tool_calls": [CALL],
                   "reasoning": "I should look it up."},
                  {"role": "tool", "tool_call_id": "functions.lookup:0",
                   "content": "batching groups requests."}], "tools": [LOOKUP]},
]  # fmt: skip


def test_the_workloads_render_conversations_token_for_token_as_vllm_does(
    cpu_python: Path, target: Path, target_server: pods.Server, tmp_path: Path
) -> None:
    """workloads/chat_template.py (extraction, vocab, training) against vLLM 0.32's own rendering
    (/tokenize) of the same OpenAI messages, on a template with a default system turn, tool
    declarations and calls, and thinking kept only after the last user turn."""
    samples = [{"format": SAMPLE_FORMAT, "id": f"c{i}", "tools": None, "tool_calls": [],
                "reasoning": "first, a thought.", "answer": "the answer.", **case}
               for i, case in enumerate(RENDERED_BOTH_WAYS)]  # fmt: skip
    path = tmp_path / "samples.json"
    path.write_text(json.dumps(samples))
    done = subprocess.run([str(cpu_python), str(REPO / "tests/workloads/render_samples.py"),
                           str(target), str(path)], capture_output=True, text=True,
                          env=pods.cpu_env(cpu_python), timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    ours = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    key = pods.SECRETS[("pipeline-api-key", "token")]

    def vllm_tokens(messages: list[Any], tools: Any, generation_prompt: bool) -> list[int]:
        body = {"messages": messages, "add_generation_prompt": generation_prompt,
                **({"tools": tools} if tools else {})}  # fmt: skip
        request = urllib.request.Request(
            target_server.url + "/tokenize", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=60) as response:
            tokens: list[int] = json.loads(response.read())["tokens"]
        return tokens

    for sample, mine in zip(samples, ours, strict=True):
        full = [*sample["messages"], generated_turn(sample)]
        assert mine["ids"] == vllm_tokens(full, sample["tools"], False), mine["text"]
        prompt = vllm_tokens(sample["messages"], sample["tools"], True)
        assert mine["ids"][: mine["prompt_tokens"]] == prompt  # the mask starts where vLLM's
        assert sum(mine["mask"]) == len(mine["ids"]) - len(prompt)  # generation prompt ends
    assert "You are Kimi" in ours[0]["text"] and "You are Kimi" not in ours[1]["text"]
    assert "the engineer asks about caching." not in ours[3]["text"]
    assert "I should look it up." in ours[4]["text"]


def test_the_pods_processes_ran_with_a_read_only_root_and_their_own_mounts(
    project: Any, volumes: Any, target_server: pods.Server
) -> None:
    """Every vLLM server and workload of this tier ran as its rendered pod's containers do:
    root filesystem read-only (readOnlyRootFilesystem), writable only where the pod mounts a
    read-write claim or an emptyDir (/tmp, HOME). Shown here on the serve pod's mounts: the
    models claim it mounts read-only cannot be written, its emptyDirs can."""
    rendered = pods.rendered(project, "serve", "none")
    mounts = volumes.mounts(rendered, "probe-serve")
    models = volumes.local("/models")
    script = (f'touch "$HOME/ok" && touch "$TMPDIR/ok" && echo writable; '
              f'touch /usr/kimideploy-probe 2>&1; touch "{models}/probe" 2>&1; true')  # fmt: skip
    done = subprocess.run(pods.sandboxed(["sh", "-c", script], mounts), capture_output=True,
                          text=True, env={**os.environ, **mounts.env()}, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("Read-only file system") == 2, done.stdout
    assert "writable" in done.stdout and not (models / "probe").exists()
    assert target_server.process.poll() is None  # the server itself runs under the same rules


def test_the_memory_plans_kv_arithmetic_is_the_capacity_vllm_reports(
    target_server: pods.Server, project: Any
) -> None:
    """The memory plan's per-token KV figure (plan/memory.py) against the capacity the real
    engine sized: on CPU vLLM gives its KV cache exactly VLLM_CPU_KVCACHE_SPACE GiB, in float32,
    and reports the blocks it made in `vllm:cache_config_info`."""
    import re

    from kimideploy.plan import memory

    text = urllib.request.urlopen(f"{target_server.url}/metrics", timeout=30).read().decode()
    line = next(ln for ln in text.splitlines() if ln.startswith("vllm:cache_config_info{"))
    labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
    blocks, block_size = int(labels["num_gpu_blocks"]), int(labels["block_size"])
    per_token = memory.kv_bytes_per_token(project.project.model, 1, "float32")
    space = float(pods.cpu_runtime_env(Path(sys.prefix))["VLLM_CPU_KVCACHE_SPACE"]) * memory.GIB
    assert per_token == 2 * 4 * 32 * 6 * 4  # K and V, 4 heads of 32, 6 layers, float32
    assert blocks * block_size == int(space // (per_token * block_size)) * block_size, labels
    FIGURES["KV capacity, vLLM vs plan (tokens)"] = (
        f"{blocks * block_size} vs {int(space // per_token)}"
    )
