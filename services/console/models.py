"""What the pages show, computed from the services' answers: fleet rows, message values,
partition ranges, the records/s chart."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any, Literal

InstanceState = Literal["ready", "recovering", "down"]

#: An en dash: ranges of partitions, and "unknown" in a cell.
DASH = "\u2013"


@dataclass
class InstanceView:
    url: str
    state: InstanceState
    instance_id: str | None = None
    error: str | None = None
    active: dict[str, list[int]] = field(default_factory=dict)
    standby: dict[str, list[int]] = field(default_factory=dict)
    #: changelog topic -> standby copies warmed up to take the partition over (a subset of standby)
    warmup: dict[str, list[int]] = field(default_factory=dict)
    lag: dict[str, int | None] = field(default_factory=dict)
    #: input topics the group's last assignment gave no instance (none of their records is processed)
    unowned_inputs: list[str] = field(default_factory=list)
    #: changelog topic -> partition -> {"source": active|standby|restoring, "lag": records or None}
    copies: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    rate: float | None = None
    processed_total: float | None = None
    history: list[tuple[float, float | None]] = field(default_factory=list)
    seen_at: float | None = None


@dataclass
class ServiceView:
    name: str
    label: str
    base_urls: list[str]
    state: Literal["up", "degraded", "down", "unknown"] = "unknown"
    error: str | None = None
    instances: list[InstanceView] = field(default_factory=list)
    history: list[tuple[float, float | None]] = field(default_factory=list)

    @property
    def rate(self) -> float | None:
        rates = [i.rate for i in self.instances if i.rate is not None]
        return sum(rates) if rates else None

    @property
    def unowned_inputs(self) -> list[str]:
        """Input topics that some instance reports no member owns (the assignment skipped them)."""
        return sorted({t for i in self.instances if i.state != "down" for t in i.unowned_inputs})


@dataclass
class FleetSnapshot:
    taken_at: float | None
    services: list[ServiceView]


# -- partitions --------------------------------------------------------------------------------------


def ranges(parts: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8" (with en dashes); [] -> "none"."""
    if not parts:
        return "none"
    out: list[str] = []
    items = sorted(set(parts))
    start = prev = items[0]
    for p in [*items[1:], None]:
        if p is not None and p == prev + 1:
            prev = p
            continue
        out.append(str(start) if start == prev else f"{start}{DASH}{prev}")
        if p is not None:
            start = prev = p
    return ", ".join(out)


def is_changelog(topic: str) -> bool:
    return topic.endswith("-changelog")


def is_internal(topic: str) -> bool:
    return topic.endswith("__assignor-__leader")


def union_partitions(by_topic: dict[str, list[int]], *, changelogs: bool) -> list[int]:
    """Partition numbers over the input topics (or the changelogs): co-partitioned, so one list."""
    out: set[int] = set()
    for topic, parts in by_topic.items():
        if not is_internal(topic) and is_changelog(topic) == changelogs:
            out.update(parts)
    return sorted(out)


def copies_behind(copies: dict[str, dict[str, dict[str, Any]]], source: str) -> str | None:
    """How far this instance's copies of one kind are behind their changelogs, in words (None: it has none)."""
    lags = [c.get("lag") for parts in copies.values() for c in parts.values() if c.get("source") == source]
    if not lags:
        return None
    if any(lag is None for lag in lags):
        return "lag not known yet"
    worst = max(lag for lag in lags if lag is not None)
    return "up to date" if worst == 0 else f"up to {worst:,} records behind"


# -- the records/s chart -----------------------------------------------------------------------------


MIN_CHART_SPAN_S = 60.0


@dataclass
class Chart:
    points: str
    width: int
    height: int
    peak: float
    span_s: float
    samples: int


def chart(history: list[tuple[float, float | None]], now: float, span_s: float, width: int = 180, height: int = 36) -> Chart:
    """An SVG polyline of records/s over the last ``span_s`` seconds (gaps where unknown drawn as 0).

    While the history is shorter than that, the chart spans what there is (a minute at least).
    """
    recent = [(t, r) for t, r in history if t >= now - span_s]
    if recent:
        span_s = min(span_s, max(MIN_CHART_SPAN_S, now - recent[0][0]))
    peak = max((r for _, r in recent if r is not None), default=0.0)
    scale = peak if peak > 0 else 1.0
    pts = []
    for t, r in recent:
        x = width * (1 - (now - t) / span_s)
        y = height - 2 - (height - 4) * ((r or 0.0) / scale)
        pts.append(f"{x:.1f},{y:.1f}")
    return Chart(" ".join(pts), width, height, peak, span_s, len(recent))


# -- message values ----------------------------------------------------------------------------------


@dataclass
class Rendered:
    kind: Literal["json", "text", "hex", "none"]
    text: str
    size: int


def _hex(data: bytes) -> str:
    lines = []
    for i in range(0, len(data), 16):
        chunk = data[i : i + 16]
        lines.append(f"{i:08x}  {chunk.hex(' ')}")
    return "\n".join(lines)


def render_bytes(b64: str | None) -> Rendered:
    """A message value as JSON when it parses, text when it decodes as UTF-8, hex otherwise."""
    if b64 is None:
        return Rendered("none", "", 0)
    try:
        data = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        return Rendered("text", b64, len(b64))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return Rendered("hex", _hex(data), len(data))
    if any((ord(c) < 32 and c not in "\t\n\r") or c == "\x7f" for c in text):
        return Rendered("hex", _hex(data), len(data))  # decodes, but it is not text anyone wrote
    try:
        parsed = json.loads(text)
    except ValueError:
        return Rendered("text", text, len(data))
    return Rendered("json", json.dumps(parsed, indent=2, ensure_ascii=False, sort_keys=False), len(data))


def render_key(item: dict[str, Any]) -> str:
    if item.get("key") is not None:
        return str(item["key"])
    if item.get("key_base64"):
        return "0x" + base64.b64decode(item["key_base64"]).hex()
    return "(no key)"


# -- time --------------------------------------------------------------------------------------------


def fmt_ms(ms: int | float | None) -> str:
    """Epoch ms as UTC ISO time to the second."""
    if ms is None:
        return DASH
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def fmt_relative(ms: int | float | None, now_ms: float) -> str:
    """How far ``ms`` is from now: "in 4m 10s", "12s ago"."""
    if ms is None:
        return ""
    delta = (ms - now_ms) / 1000
    seconds = int(abs(delta))
    if seconds < 60:
        text = f"{seconds}s"
    elif seconds < 3600:
        text = f"{seconds // 60}m {seconds % 60}s"
    elif seconds < 86400:
        text = f"{seconds // 3600}h {seconds % 3600 // 60}m"
    else:
        text = f"{seconds // 86400}d {seconds % 86400 // 3600}h"
    return f"in {text}" if delta >= 0 else f"{text} ago"


def fmt_rate(rate: float | None) -> str:
    if rate is None:
        return DASH
    return f"{rate:,.1f}" if rate < 100 else f"{rate:,.0f}"
