"""The release dashboard's per-position panel on a real Prometheus: exact (position i over the drafts
that reached it) where the engine counts drafts by length, the shipped expression over every draft
where it does not, and the same figures as `formats/vllm_metrics` computes from two scrapes.

Two /metrics endpoints on 127.0.0.1 written by prometheus_client (what vLLM's /metrics is): each
scrape adds 10 drafts of length 3 and 10 of length 1 (k=3, as suffix decoding or a shortening k
schedule produce), with 12, 5 and 3 tokens accepted at positions 0, 1, 2. Exact: 12/20, 5/10,
3/10. Over every draft: 12/20, 5/20, 3/20.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from dataclasses import replace
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import prometheus_client
import pytest

from kimideploy.formats import vllm_metrics
from kimideploy.plan.dashboard import per_position_expr
from tests import observability
from tests.local_http import answering

pytestmark = pytest.mark.integration
K = 3
PER_SCRAPE = {"drafts_by_length": {3: 10, 1: 10}, "accepted_per_position": (12, 5, 3)}
EXACT = (12 / 20, 5 / 10, 3 / 10)
OVER_EVERY_DRAFT = (12 / 20, 5 / 20, 3 / 20)


class Engine:
    """A vLLM-shaped exposition whose counters grow by PER_SCRAPE on every read."""

    def __init__(self, model: str, counts_lengths: bool) -> None:
        self.registry = prometheus_client.CollectorRegistry()
        labels = ["model_name", "engine"]

        def counter(name: str, extra: list[str] | None = None) -> prometheus_client.Counter:
            return prometheus_client.Counter(name, name, labels + (extra or []),
                                             registry=self.registry)  # fmt: skip

        self.drafts = counter("vllm:spec_decode_num_drafts").labels(model, "0")
        self.draft_tokens = counter("vllm:spec_decode_num_draft_tokens").labels(model, "0")
        self.accepted = counter("vllm:spec_decode_num_accepted_tokens").labels(model, "0")
        per_position = counter("vllm:spec_decode_num_accepted_tokens_per_pos", ["position"])
        self.per_position = [per_position.labels(model, "0", str(p)) for p in range(K)]
        self.by_length = None
        if counts_lengths:
            by_length = counter("vllm:spec_decode_num_drafts_by_draft_length", ["draft_length"])
            self.by_length = [by_length.labels(model, "0", str(n)) for n in range(K + 1)]
        self.lock = threading.Lock()

    def scrape(self) -> str:
        with self.lock:
            lengths = PER_SCRAPE["drafts_by_length"]
            self.drafts.inc(sum(lengths.values()))
            self.draft_tokens.inc(sum(n * count for n, count in lengths.items()))
            self.accepted.inc(sum(PER_SCRAPE["accepted_per_position"]))
            for counter, value in zip(self.per_position, PER_SCRAPE["accepted_per_position"],
                                      strict=True):  # fmt: skip
                counter.inc(value)
            if self.by_length is not None:
                for n, count in lengths.items():
                    self.by_length[n].inc(count)
            return prometheus_client.generate_latest(self.registry).decode()


def serving(engine: Engine) -> AbstractContextManager[str]:
    def respond(handler: BaseHTTPRequestHandler) -> None:
        body = engine.scrape().encode()
        handler.send_response(200)
        handler.send_header("Content-Type", prometheus_client.CONTENT_TYPE_LATEST)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    return answering(respond)


def by_position(series: list[dict[str, object]]) -> tuple[float, ...]:
    found = {int(s["metric"]["position"]): float(s["value"]) for s in series}  # type: ignore[index,arg-type]
    return tuple(found[p] for p in range(K))


def test_the_panel_is_exact_where_lengths_are_counted_and_falls_back_where_not(
    observability_binaries: tuple[Path, Path], tmp_path: Path
) -> None:
    newer, pinned = Engine("newer", counts_lengths=True), Engine("pinned", counts_lengths=False)
    # What the Python reader says, from two scrapes of each (the bench's and `status`'s path).
    for engine, wanted, basis in ((newer, EXACT, vllm_metrics.BASIS_BY_LENGTH),
                                  (pinned, OVER_EVERY_DRAFT, vllm_metrics.BASIS_APPROXIMATE)):  # fmt: skip
        measured = vllm_metrics.acceptance(engine.scrape(), engine.scrape())
        assert measured is not None
        assert measured.per_position_rate == pytest.approx(wanted)
        assert measured.per_position_basis == basis
        summed = vllm_metrics.summed([measured, measured])
        assert summed is not None and summed.per_position_rate == pytest.approx(wanted)
    mixed = vllm_metrics.summed([measured, replace(measured, drafts_by_length=(0, 10, 0, 10))])
    assert mixed is not None and mixed.per_position_basis == vllm_metrics.BASIS_APPROXIMATE
    with serving(newer) as newer_address, serving(pinned) as pinned_address:
        job = {"job_name": "vllm", "scrape_interval": "1s", "scrape_timeout": "1s",
               "static_configs": [{"targets": [newer_address, pinned_address]}]}  # fmt: skip
        with observability.prometheus(observability_binaries[0], tmp_path, [job]) as server:
            for model, wanted in (("newer", EXACT), ("pinned", OVER_EVERY_DRAFT)):
                expr = per_position_expr(K).replace("$model", model)
                expr = expr.replace("$__rate_interval", "10s")
                series = server.wait_for(f"count({expr}) == {K}", timeout=60)
                assert series, model
                assert by_position(server.query(expr)) == pytest.approx(wanted), model
