"""`kimideploy bench list|report`: stored bench runs, and a PNG of speedup against concurrency."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kimideploy.cluster.bench_results import StoredBench
from kimideploy.cluster.session import ClusterSession
from kimideploy.config.drafters import NO_DRAFTER
from kimideploy.errors import UsageError


def list_rows(session: ClusterSession, release: str) -> list[dict[str, Any]]:
    rows = []
    for bench in session.bench_results(release):
        levels = bench.result.levels
        rates = [lv.acceptance_rate for lv in levels if lv.acceptance_rate is not None]
        rows.append(
            {
                "run_id": bench.run_id,
                "measured_at": bench.measured_at,
                "drafter": bench.drafter,
                "revision": bench.revision,
                "cluster": bench.cluster,
                "levels": len(levels),
                "best_tokens_per_s": max((lv.output_tokens_per_s for lv in levels), default=0),
                "acceptance": f"{sum(rates) / len(rates):.1%}" if rates else "",
            }
        )
    return rows


@dataclass(frozen=True)
class SpeedupSeries:
    prompt_set: str
    concurrency: list[int]
    speedup: list[float]


def _find(stored: list[StoredBench], run_id: str) -> StoredBench:
    found = next((b for b in stored if b.run_id == run_id), None)
    if found is None:
        known = ", ".join(b.run_id for b in stored) or "none stored"
        raise UsageError(
            f"no stored bench run {run_id} (known: {known})", hint="`kimideploy bench list`"
        )
    return found


def _baseline_for(stored: list[StoredBench], run: StoredBench) -> StoredBench:
    """The newest non-speculative run measured on the same serve configuration and settings."""
    candidates = [
        b
        for b in stored
        if b.drafter == NO_DRAFTER
        and b.cluster == run.cluster
        and b.serve_fingerprint == run.serve_fingerprint
        and b.bench_fingerprint == run.bench_fingerprint
    ]
    if not candidates:
        raise UsageError(
            f"run {run.run_id} has no comparable non-speculative run to compute speedups from",
            hint="`kimideploy up serve --drafter X --gate` measures one",
        )
    earlier = [b for b in candidates if b.measured_at <= run.measured_at]
    return (earlier or candidates)[-1]


def speedup_series(
    stored: list[StoredBench], run_id: str
) -> tuple[StoredBench, list[SpeedupSeries]]:
    run = _find(stored, run_id)
    if run.drafter == NO_DRAFTER:
        raise UsageError(
            f"run {run_id} is a non-speculative baseline; report a drafter's run",
            hint="`kimideploy bench list` shows each run's drafter",
        )
    baseline = _baseline_for(stored, run)
    base = baseline.result.by_key()
    series: dict[str, list[tuple[int, float]]] = {}
    for level in run.result.levels:
        match = base.get(level.key)
        if match and match.output_tokens_per_s and level.output_tokens_per_s:
            ratio = level.output_tokens_per_s / match.output_tokens_per_s
            series.setdefault(level.prompt_set, []).append((level.concurrency, ratio))
    if not series:
        raise UsageError(f"run {run_id} and baseline {baseline.run_id} share no level")
    return run, [
        SpeedupSeries(name, [c for c, _ in sorted(points)], [s for _, s in sorted(points)])
        for name, points in sorted(series.items())
    ]


def write_chart(
    run: StoredBench, series: list[SpeedupSeries], output: Path, min_speedup: float
) -> None:
    """Speedup against concurrency (log2 axis), one line per prompt set, the gate threshold and
    break-even (1.0) drawn for reference."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError as exc:
        raise UsageError(
            "`bench report` draws with matplotlib, which is not installed",
            hint="pip install 'kimideploy[report]'",
        ) from exc
    figure, axes = pyplot.subplots(figsize=(7, 4.2), dpi=120)
    for line in series:
        axes.plot(line.concurrency, line.speedup, marker="o", label=line.prompt_set)
        for x, y in zip(line.concurrency, line.speedup, strict=True):
            axes.annotate(
                f"{y:.2f}x", (x, y), textcoords="offset points", xytext=(0, 6), ha="center"
            )
    axes.axhline(1.0, color="grey", linestyle="--", linewidth=1, label="no drafter (1.0x)")
    axes.axhline(
        min_speedup,
        color="tab:red",
        linestyle=":",
        linewidth=1,
        label=f"gate threshold ({min_speedup:.2f}x)",
    )
    axes.set_xscale("log", base=2)
    levels = sorted({c for line in series for c in line.concurrency})
    axes.set_xticks(levels, [str(c) for c in levels])
    axes.set_xlabel("concurrent requests")
    axes.set_ylabel("speedup (output tokens/s vs no drafter)")
    axes.set_title(f"{run.drafter} on {run.cluster}, bench run {run.run_id} ({run.measured_at})")
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, format="png")
    pyplot.close(figure)


def report(
    session: ClusterSession, release: str, run_id: str, output: Path, min_speedup: float
) -> list[str]:
    """Write the chart; returns one summary line per prompt set."""
    run, series = speedup_series(session.bench_results(release), run_id)
    write_chart(run, series, output, min_speedup)
    measured_on = [f"measured on {run.result.kernels}"] if run.result.kernels else []
    return measured_on + [
        f"{line.prompt_set}: "
        + ", ".join(f"c={c} {s:.2f}x" for c, s in zip(line.concurrency, line.speedup, strict=True))
        for line in series
    ]
