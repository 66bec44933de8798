"""bench: throughput and latency of a serve release, with acceptance from vLLM's own counters.

Fixed, deterministic prompt sets (chat and reasoning) at each configured concurrency; every
request streams, so TTFT and TPOT are measured per request. vLLM's /metrics is scraped before and
after each level for acceptance rate, mean acceptance length and per-position acceptance; where
every response carries its own acceptance (vLLM >= 0.32, --per-request-spec-decode-metrics, which
the serve plan sets), those are summed instead, so traffic from others on the release does not
skew the level (`metrics: requests`; the scraped rate stays next to it). With a baseline (a
non-speculative run's result.json) the speedup per level is reported.

For `run calibrate` (spec.synthetic) the levels are measured once per synthetic acceptance length,
each pass after setting that length on the server (synthetic_acceptance.py) and emptying its
prefix cache, so every pass starts from the same cache state; each level then carries the length
asked for next to the one vLLM's counters measured.
"""

from __future__ import annotations

import json
import math
import random
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from kimideploy.config.specs import SYNTHETIC_CONTROL_METHOD, BenchSpec, SyntheticSweep
from kimideploy.formats.bench_result import BenchLevel, BenchResult
from kimideploy.formats.output_diversity import Diversity, distinct_bigrams
from kimideploy.formats.prompts import PromptFileError, load_prompts
from kimideploy.formats.vllm_metrics import acceptance, from_requests, parse_with_client
from kimideploy.workloads.runtime import (
    EXIT_FAILED,
    EXIT_OK,
    BadInputError,
    Progress,
    atomic_write,
    emit,
    json_request_headers,
    log,
)
from kimideploy.workloads.synthetic_acceptance import rates_for_length

TOPICS = [
    "tensor parallelism",
    "speculative decoding",
    "KV caches",
    "mixture of experts",
    "PCIe versus NVLink",
    "quantization",
    "attention",
    "batching",
]


def spec_prompts(spec: BenchSpec, prompt_set: str) -> list[list[dict[str, Any]]]:
    """A named file's first num_prompts usable prompts, or a built-in set."""
    path = spec.prompt_files.get(prompt_set)
    if path is None:
        return make_prompts(prompt_set, spec.num_prompts)
    try:
        found = load_prompts(Path(path))
    except (OSError, UnicodeDecodeError, PromptFileError) as exc:
        raise BadInputError(
            f"bench.prompt_files.{prompt_set}: cannot read {path} ({exc})",
            hint="copy the prompt file onto the datasets volume first",
        ) from exc
    usable = [p.messages for p in found.prompts][: spec.num_prompts]
    if not usable:
        raise BadInputError(
            f"bench.prompt_files.{prompt_set}: no usable prompt in {path} "
            f"({'; '.join(found.bad[:3]) or 'empty'})"
        )
    return usable


def make_prompts(prompt_set: str, count: int) -> list[list[dict[str, str]]]:
    """The same prompts every run (seeded), so runs and baselines compare like with like."""
    rng = random.Random(f"kimideploy-bench-{prompt_set}")
    prompts = []
    for i in range(count):
        if prompt_set == "reasoning":
            a, b, c = rng.randint(12, 99), rng.randint(12, 99), rng.randint(100, 999)
            text = (
                f"Think step by step: what is {a} * {b} - {c}? Check the result before answering."
            )
        else:
            text = f"In a few sentences, explain {TOPICS[i % len(TOPICS)]} to an engineer (#{i})."
        prompts.append([{"role": "user", "content": text}])
    return prompts


def request(spec: BenchSpec, messages: list[dict[str, Any]]) -> dict[str, Any]:
    body = {
        "model": spec.target.served_name,
        "messages": messages,
        "max_tokens": spec.max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    req = urllib.request.Request(
        spec.endpoint.rstrip("/") + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers=json_request_headers(),
    )
    start = time.perf_counter()
    first: float | None = None
    chunks, usage, spec_decode = 0, None, None
    pieces: list[str] = []
    try:
        with urllib.request.urlopen(req, timeout=600) as response:
            for raw in response:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                event = json.loads(line[5:])
                usage = event.get("usage") or usage
                # The final usage chunk carries the request's own acceptance (vLLM >= 0.32).
                spec_decode = (event.get("metrics") or {}).get(
                    "speculative_decoding"
                ) or spec_decode
                for choice in event.get("choices") or []:
                    delta = choice.get("delta") or {}
                    text = (
                        delta.get("content")
                        or delta.get("reasoning_content")
                        or delta.get("reasoning")
                    )
                    if text:
                        pieces.append(str(text))
                        chunks += 1
                        first = first if first is not None else time.perf_counter()
    except (OSError, ValueError) as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    end = time.perf_counter()
    tokens = int((usage or {}).get("completion_tokens") or chunks)
    ttft = (first or end) - start
    tpot = (end - (first or end)) / (tokens - 1) if tokens > 1 else None
    diversity = distinct_bigrams("".join(pieces))
    figures = {"tokens": tokens, "ttft": ttft, "tpot": tpot, "distinct_bigrams": diversity}
    return {"ok": True, "spec_decode": spec_decode, **figures}


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = math.ceil(q / 100 * len(ordered))  # nearest rank
    return ordered[min(len(ordered), max(rank, 1)) - 1]


def scrape(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return str(response.read().decode())
    except OSError:
        return None


def measure(spec: BenchSpec, prompt_set: str, concurrency: int) -> BenchLevel:
    prompts = spec_prompts(spec, prompt_set)
    before = scrape(spec.metrics_url)
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(lambda m: request(spec, m), prompts))
    wall = time.perf_counter() - start
    after = scrape(spec.metrics_url)
    done = [r for r in results if r["ok"]]
    tokens = sum(r["tokens"] for r in done)
    ttfts = [r["ttft"] for r in done]
    tpots = [r["tpot"] for r in done if r["tpot"] is not None]
    # prometheus_client (in the vLLM image) reads the exposition the way it wrote it.
    scraped = before is not None and after is not None
    counted = acceptance(before or "", after or "", parse_with_client) if scraped else None
    own = [r["spec_decode"] for r in done if r.get("spec_decode")]
    # Every request's own figures, or none: a mix would weigh the reporting requests only.
    accepted = from_requests(own) if done and len(own) == len(done) else counted
    source = "requests" if accepted is not None and accepted is not counted else None
    diversity = Diversity.of(r["distinct_bigrams"] for r in done)
    return BenchLevel(
        prompt_set=prompt_set,
        concurrency=concurrency,
        requests=len(results),
        failed=len(results) - len(done),
        output_tokens=tokens,
        seconds=round(wall, 3),
        output_tokens_per_s=round(tokens / wall, 3) if wall else 0.0,
        ttft_p50_s=percentile(ttfts, 50),
        ttft_p99_s=percentile(ttfts, 99),
        tpot_p50_s=percentile(tpots, 50),
        tpot_p99_s=percentile(tpots, 99),
        # requests: each response's own acceptance; scraped: /metrics over the level's window.
        metrics=source or ("scraped" if scraped else "unavailable"),
        acceptance_rate=accepted.rate if accepted else None,
        mean_acceptance_length=accepted.mean_acceptance_length if accepted else None,
        per_position_acceptance=tuple(accepted.per_position_rate) if accepted else None,
        per_position_basis=accepted.per_position_basis if accepted else None,
        scraped_acceptance_rate=counted.rate if counted else None,
        errors=tuple(sorted({r["error"] for r in results if not r["ok"]})[:3]),
        distinct_bigrams=diversity.mean_distinct_bigrams,
        judged_outputs=diversity.judged,
        degenerate_outputs=diversity.degenerate,
    )


def load_baseline(baseline_path: str | None) -> dict[tuple[str, int], float] | None:
    """Output tokens/s per (prompt set, concurrency) of the baseline run, read before measuring:
    a baseline that is gone should cost seconds, not a whole bench."""
    if not baseline_path:
        return None
    try:
        levels = json.loads(Path(baseline_path).read_text())["levels"]
        return {(b["prompt_set"], int(b["concurrency"])): b["output_tokens_per_s"] for b in levels}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BadInputError(
            f"bench.baseline_run: cannot read the baseline result {baseline_path} ({exc}); "
            "`kimideploy run bench --baseline` picks a stored run instead"
        ) from exc


def with_baseline(
    levels: list[BenchLevel], base: dict[tuple[str, int], float] | None
) -> list[BenchLevel]:
    if not base:
        return levels
    compared = []
    for level in levels:
        tokens_per_s = base.get(level.key)
        if tokens_per_s:
            speedup = round(level.output_tokens_per_s / tokens_per_s, 4)
            level = replace(level, baseline_tokens_per_s=tokens_per_s, speedup=speedup)
        compared.append(level)
    return compared


def _post(url: str, body: dict[str, Any] | None = None) -> Any:
    req = urllib.request.Request(
        url, data=json.dumps(body or {}).encode(), headers=json_request_headers(), method="POST"
    )
    with urllib.request.urlopen(req, timeout=120) as response:
        text = response.read().decode()
    return json.loads(text) if text.strip() else None


def set_synthetic_acceptance(sweep: SyntheticSweep, length: float) -> list[float]:
    """Set the server's synthetic acceptance length; a server that cannot is a bad input (it was
    not deployed as a calibration revision), not a measurement to report."""
    rates = rates_for_length(length, sweep.num_speculative_tokens)
    body = {"method": SYNTHETIC_CONTROL_METHOD, "args": [json.dumps(rates)], "timeout": 60}
    try:
        answer = _post(sweep.control_url, body)
        _post(sweep.reset_prefix_cache_url)
    except (OSError, ValueError) as exc:
        raise BadInputError(
            f"bench.synthetic: {sweep.control_url} did not take acceptance length {length} "
            f"({exc}); the serve revision must be a calibration revision (`run calibrate` "
            "deploys one)"
        ) from exc
    log(f"synthetic acceptance length {length}: rates {rates} ({answer})")
    return rates


def run(spec: BenchSpec) -> int:
    baseline = load_baseline(spec.baseline_path)
    levels: list[BenchLevel] = []
    passes: list[float | None] = (
        list(spec.synthetic.acceptance_lengths) if spec.synthetic else [None]
    )
    total = len(passes) * len(spec.prompt_sets) * len(spec.concurrency)
    progress = Progress("bench", "levels", total)
    for length in passes:
        rates = None
        if spec.synthetic is not None and length is not None:
            rates = set_synthetic_acceptance(spec.synthetic, length)
        for prompt_set in spec.prompt_sets:
            for concurrency in spec.concurrency:
                level = measure(spec, prompt_set, concurrency)
                if rates is not None:
                    level = replace(
                        level, synthetic_acceptance_length=length, synthetic_rates=tuple(rates)
                    )
                levels.append(level)
                # Every level is an event, with its rate: `run` keeps the rate for the next
                # bench's estimate (services/runs/run_rates.py).
                progress.advance(force=True)
    levels = with_baseline(levels, baseline)
    result = BenchResult(
        levels=tuple(levels),
        run_id=spec.run_id,
        drafter=spec.drafter,
        endpoint=spec.endpoint,
        model=spec.target.served_name,
        max_tokens=spec.max_tokens,
        baseline=spec.baseline_path,
        num_speculative_tokens=spec.synthetic.num_speculative_tokens if spec.synthetic else None,
        kernels=spec.kernels,
    ).as_dict()
    out = Path(spec.results_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "result.json", json.dumps(result, indent=2, sort_keys=True).encode())
    emit({"event": "result", "stage": "bench", **result})
    for level in levels:
        throughput = f"{level.output_tokens_per_s:>9.1f} tok/s"
        log(
            f"{level.prompt_set:9} c={level.concurrency:<4} {throughput}  "
            f"TTFT p50 {level.ttft_p50_s}  TPOT p50 {level.tpot_p50_s}  "
            f"acceptance {level.acceptance_rate}  speedup {level.speedup}  "
            f"distinct bigrams {level.distinct_bigrams}"
            + (
                f"  DEGENERATE: {level.degenerate_outputs} of {level.judged_outputs} outputs "
                "repeat themselves; the gate will not judge on this level"
                if level.degenerate
                else ""
            )
        )
    return EXIT_OK if any(level.output_tokens for level in levels) else EXIT_FAILED
