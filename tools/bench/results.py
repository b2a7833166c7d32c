"""The benchmarks' results file: every figure a run of ``python -m tools.bench`` measures,
one JSON line each, appended to ``docs/bench-results.jsonl``.

An entry holds the figure's id, value and unit, the baseline measured in the same run and
the ratio of the two, the commit (and whether the tree had uncommitted changes), the
machine (cores, CPU model, memory, load average at the start and the end of the area's
run), the time and the exact command. The file only grows, so the history of a figure is
``grep '"figure": "<id>"'`` away; ``tools.bench.report`` turns the latest entry of each
figure into the table at the top of docs/benchmarks.md.

Figures are recorded while a :func:`session` is open (``python -m tools.bench`` opens one
per area); outside one (a test calling an area's functions) :func:`record` only returns.
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "bench-results.jsonl"


@dataclass
class Session:
    area: str
    command: str
    commit: dict[str, Any]
    machine: dict[str, Any]
    load_start: list[float]
    started: str
    figures: list[dict[str, Any]] = field(default_factory=list)


_current: Session | None = None


def commit() -> dict[str, Any]:
    """The checked-out commit and whether tracked files outside docs/ differ from it."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False).stdout.strip()

    # docs/ is left out: the results file itself is there, and the runs append to it.
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs")
    return {"sha": git("rev-parse", "HEAD") or None, "dirty": bool(dirty)}


def machine() -> dict[str, Any]:
    """Cores, CPU model, memory and Python of this machine."""
    model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "arch": platform.machine(),
        "cores": os.cpu_count(),
        "cpu": model or platform.processor() or None,
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
    }


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


@contextmanager
def session(area: str, argv: Sequence[str] | None = None, path: Path = RESULTS) -> Iterator[Session]:
    """Collect the figures of one area's run and append them to ``path`` when it ends (also
    when it fails part-way: what was measured by then is kept)."""
    global _current
    argv = list(sys.argv if argv is None else argv)
    command = (
        shlex.join(["python", "-m", "tools.bench", *argv[1:]]) if argv and argv[0].endswith("__main__.py") else shlex.join(argv)
    )
    _current = Session(area, command, commit(), machine(), _load(), _now())
    try:
        yield _current
    finally:
        done, _current = _current, None
        if done.figures:
            common = {
                "area": done.area,
                "commit": done.commit["sha"],
                "dirty": done.commit["dirty"],
                "machine": done.machine,
                "load_start": done.load_start,
                "load_end": _load(),
                "started": done.started,
                "date": _now(),
                "command": done.command,
            }
            with open(path, "ab") as out:
                for figure in done.figures:
                    out.write(orjson.dumps({**figure, **common}) + b"\n")
            print(f"[bench] {len(done.figures)} figure(s) of {area} appended to {path}", flush=True)


def record(figure: str, value: float | None, unit: str, baseline: float | None = None, note: str | None = None) -> None:
    """One measured figure of the running area (``baseline``: the bare client doing the same
    Kafka work in the same run, in the same unit). A figure not measured (None) is not kept."""
    if _current is None or value is None:
        return
    entry: dict[str, Any] = {"figure": figure, "value": round(float(value), 4), "unit": unit}
    if baseline is not None:
        entry["baseline"] = round(float(baseline), 4)
        entry["ratio"] = round(value / baseline, 4) if baseline else None
    if note:
        entry["note"] = note
    _current.figures.append(entry)


def load(path: Path = RESULTS) -> list[dict[str, Any]]:
    """Every entry of the results file, oldest first."""
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def latest(entries: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The last entry of each figure."""
    found: dict[str, dict[str, Any]] = {}
    for entry in entries:
        found[entry["figure"]] = entry
    return found
