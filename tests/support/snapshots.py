"""Text snapshots: what a test produced, compared with a file kept beside it.

``STATEFLEET_UPDATE_SNAPSHOTS=1`` writes the file anew instead (then review the diff)."""

from __future__ import annotations

import os
from pathlib import Path


def assert_matches_snapshot(text: str, snapshot: Path) -> None:
    if os.environ.get("STATEFLEET_UPDATE_SNAPSHOTS") == "1":
        snapshot.write_text(text + "\n")
    assert snapshot.exists(), f"no snapshot {snapshot}: run with STATEFLEET_UPDATE_SNAPSHOTS=1 and review it"
    expected = snapshot.read_text().rstrip("\n")
    assert text == expected, f"{snapshot.name} differs (STATEFLEET_UPDATE_SNAPSHOTS=1 rewrites it):\n{text}"
