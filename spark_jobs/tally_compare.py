"""Comparing backfilled tallies with the live tallies service (``GET /tallies``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from services.tallies.domain import Tally

PAGE = 1000


class LiveServiceError(RuntimeError):
    """The tallies service could not be read; the message says what to check."""


def fetch_live_tallies(base_url: str, timeout_s: float = 30.0, transport: httpx.BaseTransport | None = None) -> dict[str, Tally]:
    """Every tally the service holds, following ``next_cursor`` page by page."""
    url = base_url.rstrip("/") + "/tallies"
    out: dict[str, Tally] = {}
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
                out[item["program_id"]] = Tally(
                    program_id=item["program_id"],
                    numberActive=int(item["numberActive"]),
                    numberInactive=int(item["numberInactive"]),
                    lastLogin=int(item["lastLogin"]) if item.get("lastLogin") is not None else None,
                )
            cursor = body.get("next_cursor")
            if not cursor:
                return out


@dataclass(frozen=True)
class Difference:
    program_id: str
    backfill: Tally | None
    live: Tally | None

    def describe(self) -> str:
        if self.live is None:
            return f"{self.program_id}: only in the backfill {self.backfill}"
        if self.backfill is None:
            return f"{self.program_id}: only in the live service {self.live}"
        fields = [
            f"{name} backfill={getattr(self.backfill, name)} live={getattr(self.live, name)}"
            for name in ("numberActive", "numberInactive", "lastLogin")
            if getattr(self.backfill, name) != getattr(self.live, name)
        ]
        return f"{self.program_id}: " + ", ".join(fields)


def differences(backfill: Mapping[str, Tally], live: Mapping[str, Tally]) -> list[Difference]:
    """Programs whose tallies differ, or that only one side has, in program_id order."""
    out = []
    for program in sorted(set(backfill) | set(live)):
        b, lv = backfill.get(program), live.get(program)
        if b != lv:
            out.append(Difference(program, b, lv))
    return out
