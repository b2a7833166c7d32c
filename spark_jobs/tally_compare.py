"""Comparing backfilled tallies with the live tallies service (``GET /tallies``): rows of any
projection, each a JSON object keyed by the projection's ``key_field``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

PAGE = 1000

Row = Mapping[str, Any]


class LiveServiceError(RuntimeError):
    """The tallies service could not be read; the message says what to check."""


def fetch_live_tallies(
    base_url: str, key_field: str = "program_id", timeout_s: float = 30.0, transport: httpx.BaseTransport | None = None
) -> dict[str, dict[str, Any]]:
    """Every row the service holds, by its ``key_field``, following ``next_cursor`` page by page."""
    url = base_url.rstrip("/") + "/tallies"
    out: dict[str, dict[str, Any]] = {}
    cursor: str | None = None
    with httpx.Client(timeout=timeout_s, transport=transport) as client:
        while True:
            params: dict[str, str | int] = {"limit": PAGE}
            if cursor:
                params["cursor"] = cursor
            try:
                response = client.get(url, params=params)
            except httpx.HTTPError as exc:
                raise LiveServiceError(f"cannot reach the tallies service at {url}: {exc}; is it running?") from exc
            if response.status_code != 200:
                raise LiveServiceError(f"GET {response.url} answered {response.status_code}: {response.text[:500]}")
            body = response.json()
            for item in body.get("items", []):
                if key_field not in item:
                    raise LiveServiceError(
                        f"GET {response.url} answered rows without {key_field!r}: does the service run the same projection?"
                    )
                out[str(item[key_field])] = dict(item)
            cursor = body.get("next_cursor")
            if not cursor:
                return out


@dataclass(frozen=True)
class Difference:
    key: str
    backfill: Row | None
    live: Row | None

    def describe(self) -> str:
        if self.live is None:
            return f"{self.key}: only in the backfill {dict(self.backfill or {})}"
        if self.backfill is None:
            return f"{self.key}: only in the live service {dict(self.live)}"
        names = list(dict.fromkeys([*self.backfill, *self.live]))
        fields = [
            f"{name} backfill={self.backfill.get(name)} live={self.live.get(name)}"
            for name in names
            if self.backfill.get(name) != self.live.get(name)
        ]
        return f"{self.key}: " + ", ".join(fields)


def differences(backfill: Mapping[str, Row], live: Mapping[str, Row]) -> list[Difference]:
    """Keys whose rows differ, or that only one side has, in key order."""
    out = []
    for key in sorted(set(backfill) | set(live)):
        b, lv = backfill.get(key), live.get(key)
        if b != lv:
            out.append(Difference(key, b, lv))
    return out
