"""requirements.lock pins, with hashes, every package pyproject.toml asks for, within its bounds."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]


def locked() -> dict[str, tuple[str, int]]:
    """name -> (version, number of hashes) of every package in the lock."""
    text = (REPO / "requirements.lock").read_text()
    out: dict[str, tuple[str, int]] = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", text):
        m = re.match(r"([A-Za-z0-9._-]+)==(\S+)", block)
        if m:
            out[canonicalize_name(m.group(1))] = (m.group(2), block.count("--hash=sha256:"))
    return out


def test_every_requirement_is_locked_exactly_with_hashes() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["spark"], *project["optional-dependencies"]["dev"]]
    lock = locked()
    assert len(lock) > len(wanted)  # transitive dependencies are pinned too
    problems = []
    for spec in map(Requirement, wanted):
        version, hashes = lock.get(canonicalize_name(spec.name), (None, 0))
        if version is None or not spec.specifier.contains(version, prereleases=True):
            problems.append(f"{spec}: locked {version}")
        elif hashes == 0:
            problems.append(f"{spec}: no hash")
    assert not problems, "requirements.lock is out of step with pyproject.toml (make lock): " + ", ".join(problems)
    assert all(hashes for _, hashes in lock.values())
    assert lock["faust-streaming"][0] == "0.15.3" and lock["aiokafka"][0] == "0.14.0"
