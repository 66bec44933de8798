"""Where a vLLM start-up's time went, read from vLLM's own log lines (vLLM 0.32).

The lines, where the pinned sources print them, and what each says:
- `Starting to load model M...` (v1/worker/gpu_model_runner.py, cpu_model_runner.py): imports
  are done and loading begins;
- `Loading weights took X seconds` (model_loader/default_loader.py, once a process): the
  target's weights were read;
- `Model loading took A GiB memory and X seconds` (gpu_model_runner.py, gpu/model_runner.py):
  the model is built, its weights read and processed, the drafter loaded;
- `torch.compile took X s in total` (compilation/monitor.py), with `Directly load the compiled
  graph(s)` (a warm compile cache) or `Compiling a graph for` (a cold one) from
  compilation/backends.py: compiling, inside the engine's initialisation;
- `Graph capturing finished in X secs, took A GiB` (both GPU model runners): CUDA graphs, inside
  the engine's initialisation;
- `init engine (profile, create kv cache, warmup model) took X s` (v1/engine/core.py):
  profiling, the KV cache, compiling, warm-up and graph capture together;
- `Starting vLLM server on ADDRESS` (entrypoints/launchers/api_server/entry.py): the HTTP server.

`Memory profiling takes X seconds` is logged only at DEBUG in vLLM 0.32 (gpu_worker.py logs the
profile result with `logger.debug`), so profiling is what init engine took minus compile and graph
capture. Where vLLM states a duration it is used (its clock, sub-second); the rest is measured
between the lines' timestamps: the kubelet's (`kubectl logs --timestamps`, nanoseconds) when the
lines carry them, else vLLM's own (`MM-DD HH:MM:SS`, whole seconds). The CPU model runner logs
neither `Model loading took` nor graph capture; its processing phase is measured to the next line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

PHASES = (
    "container and imports",
    "weights read",
    "weight processing",
    "torch.compile",
    "profiling and KV cache",
    "graph capture",
    "API server ready",
)
"""The table's rows, in the order a start-up passes them."""

_KUBELET_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)\s")
_VLLM_TIME = re.compile(r"\b(?:INFO|WARNING|DEBUG|ERROR)\s+(\d\d-\d\d \d\d:\d\d:\d\d)\b")
_SECONDS = r"([0-9]+(?:\.[0-9]+)?)"
_MARKS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("load start", re.compile(r"Starting to load model ")),
    ("weights read", re.compile(rf"Loading weights took {_SECONDS} seconds")),
    ("model loaded", re.compile(rf"Model loading took [0-9.]+ GiB memory and {_SECONDS} seconds")),
    ("compile start", re.compile(r"Starting torch\.compile")),
    ("compile", re.compile(rf"torch\.compile took {_SECONDS} s in total")),
    ("compile cache hit", re.compile(r"Directly load the compiled graph")),
    ("compile cache miss", re.compile(r"Compiling a graph for ")),
    ("graph capture", re.compile(rf"Graph capturing finished in {_SECONDS} secs")),
    (
        "engine ready",
        re.compile(rf"init engine \(profile, create kv cache, warmup model\) took {_SECONDS} s"),
    ),
    ("server start", re.compile(r"Starting vLLM server on ")),
)


@dataclass(frozen=True)
class Phase:
    name: str
    seconds: float
    source: str
    """"vLLM" (a duration vLLM printed) or "log times" (between two lines' timestamps)."""


@dataclass(frozen=True)
class StartupPhases:
    """One start-up, by phase. `total_s` runs from the container's start to Ready (when both
    are known); `reached` is the last phase whose line was seen (a start-up still going)."""

    phases: tuple[Phase, ...]
    total_s: float | None = None
    compile_cache: str | None = None
    """"warm" (vLLM loaded compiled graphs), "cold" (it compiled), None (no compile)."""
    reached: str | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def accounted_s(self) -> float:
        return round(sum(p.seconds for p in self.phases), 1)

    def seconds(self, name: str) -> float | None:
        return next((p.seconds for p in self.phases if p.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        """What a release record and `-o json` keep."""
        return {
            "phases": [asdict(p) for p in self.phases],
            "total_s": self.total_s,
            "accounted_s": self.accounted_s,
            "compile_cache": self.compile_cache,
            "reached": self.reached,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StartupPhases:
        return cls(
            phases=tuple(Phase(**p) for p in data.get("phases") or []),
            total_s=data.get("total_s"),
            compile_cache=data.get("compile_cache"),
            reached=data.get("reached"),
            notes=tuple(data.get("notes") or ()),
        )

    def lines(self) -> list[str]:
        """The table as text, one phase a line."""
        width = max((len(p.name) for p in self.phases), default=10)
        out = [f"  {p.name:<{width}}  {p.seconds:8.1f} s  ({p.source})" for p in self.phases]
        if self.total_s is not None:
            rest = round(self.total_s - self.accounted_s, 1)
            out.append(f"  {'total, container start to Ready':<{width}}  {self.total_s:8.1f} s")
            if abs(rest) >= 1:
                out.append(f"  {'(between the lines above)':<{width}}  {rest:8.1f} s")
        if self.compile_cache:
            out.append(f"  compile cache: {self.compile_cache}")
        out += [f"  note: {note}" for note in self.notes]
        return out


@dataclass(frozen=True)
class _Mark:
    key: str
    at: datetime | None
    value: float | None


def _time(line: str, year: int) -> tuple[datetime | None, str]:
    """The line's time (the kubelet's prefix, else vLLM's own) and the line without the prefix."""
    kubelet = _KUBELET_TIME.match(line)
    if kubelet:
        stamp = (
            kubelet.group(1)
            + (kubelet.group(2) or "")[:7]
            + kubelet.group(3).replace("Z", "+00:00")
        )
        return datetime.fromisoformat(stamp), line[kubelet.end() :]
    own = _VLLM_TIME.search(line)
    if not own:
        return None, line
    at = datetime.strptime(f"{year}-{own.group(1)}", "%Y-%m-%d %H:%M:%S")
    return at.replace(tzinfo=UTC), line


def _marks(lines: Iterable[str], year: int) -> list[_Mark]:
    marks: list[_Mark] = []
    for raw in lines:
        at, line = _time(raw.rstrip("\n"), year)
        for key, pattern in _MARKS:
            found = pattern.search(line)
            if found:
                value = float(found.group(1)) if found.groups() else None
                marks.append(_Mark(key, at, value))
                break
    return marks


def _slowest(marks: list[_Mark], key: str) -> _Mark | None:
    """The line of `key`: with tensor parallelism every worker prints its own, and the phase
    lasts until the slowest rank's (the largest stated duration); else the first."""
    found = [m for m in marks if m.key == key]
    timed = [m for m in found if m.value is not None]
    if timed:
        return max(timed, key=lambda m: m.value or 0.0)
    return found[0] if found else None


def _between(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return max(0.0, round((end - start).total_seconds(), 1))


def parse(
    lines: Iterable[str], *, started_at: datetime | None = None, ready_at: datetime | None = None
) -> StartupPhases:
    """The phase table of one start-up's log (complete or still going). `started_at` is the
    container's start and `ready_at` its Ready time (the pod's status), when known."""
    year = (started_at or datetime.now(UTC)).year
    marks = _marks(lines, year)
    get = {key: _slowest(marks, key) for key, _ in _MARKS}
    phases: list[Phase] = []
    notes: list[str] = []

    def add(name: str, seconds: float | None, source: str) -> None:
        if seconds is not None:
            phases.append(Phase(name, round(seconds, 1), source))

    load_start, read = get["load start"], get["weights read"]
    loaded, engine = get["model loaded"], get["engine ready"]
    add(
        "container and imports",
        _between(started_at, load_start.at if load_start else None),
        "log times",
    )
    if read is not None:
        add("weights read", read.value, "vLLM")
    if loaded is not None and loaded.value is not None:
        add("weight processing", loaded.value - (read.value or 0.0 if read else 0.0), "vLLM")
    elif read is not None:
        # The CPU runner prints no "Model loading took": processing (and the drafter) runs from
        # the weights' line to whatever comes next.
        after = next((m for m in marks[marks.index(read) + 1 :] if m.at is not None), None)
        add("weight processing", _between(read.at, after.at if after else None), "log times")
    compile_s = get["compile"].value if get["compile"] else None
    capture_s = get["graph capture"].value if get["graph capture"] else None
    add("torch.compile", compile_s, "vLLM")
    if engine is not None and engine.value is not None:
        profiling = engine.value - (compile_s or 0.0) - (capture_s or 0.0)
        add("profiling and KV cache", max(0.0, profiling), "vLLM")
    add("graph capture", capture_s, "vLLM")
    server = get["server start"]
    ready_from = engine.at if engine else None
    add(
        "API server ready",
        _between(ready_from, ready_at or (server.at if server else None)),
        "log times",
    )
    if get["compile cache hit"] and not get["compile cache miss"]:
        cache: str | None = "warm"
    elif get["compile cache miss"]:
        cache = "cold"
    else:
        cache = None
    if engine is None and marks:
        notes.append("the engine has not finished starting")
    reached = _reached(marks)
    return StartupPhases(
        phases=tuple(phases),
        total_s=_between(started_at, ready_at),
        compile_cache=cache,
        reached=reached,
        notes=tuple(notes),
    )


_REACHED = {
    "load start": "weights read",
    "weights read": "weight processing",
    "model loaded": "profiling and KV cache",
    "compile start": "torch.compile",
    "compile cache hit": "torch.compile",
    "compile cache miss": "torch.compile",
    "compile": "profiling and KV cache",
    "graph capture": "profiling and KV cache",
    "engine ready": "API server ready",
    "server start": "API server ready",
}
"""After a line, the phase the start-up is in."""


def _reached(marks: list[_Mark]) -> str | None:
    if not marks:
        return None
    return _REACHED.get(marks[-1].key)


def in_progress(lines: Iterable[str]) -> str | None:
    """The phase a start-up that is still going is in, from its log so far ("container and
    imports" before vLLM's first line of interest; None when nothing was logged)."""
    materialised = list(lines)
    if not materialised:
        return None
    return _reached(_marks(materialised, datetime.now(UTC).year)) or "container and imports"
