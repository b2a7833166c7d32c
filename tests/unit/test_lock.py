"""requirements.lock pins, with hashes, every package pyproject.toml asks for, within its bounds."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]


def locked(name: str = "requirements.lock") -> dict[str, tuple[str, int]]:
    """name -> (version, number of hashes) of every package in the lock."""
    return {pkg: (version, len(hashes)) for pkg, (version, hashes) in locked_hashes(name).items()}


def locked_hashes(name: str) -> dict[str, tuple[str, frozenset[str]]]:
    """name -> (version, its hashes) of every package in the lock file ``name``."""
    text = (REPO / name).read_text()
    out: dict[str, tuple[str, frozenset[str]]] = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", text):
        m = re.match(r"([A-Za-z0-9._-]+)==(\S+)", block)
        if m:
            out[canonicalize_name(m.group(1))] = (m.group(2), frozenset(re.findall(r"--hash=sha256:(\w+)", block)))
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


def test_the_image_lock_is_runtime_and_spark_at_the_versions_of_the_full_lock() -> None:
    """requirements-image.lock (what the image installs, `make lock` writes both) pins every
    runtime and spark requirement with hashes, exactly as requirements.lock does, and no
    package that only the dev extra brings in."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    runtime = [*project["dependencies"], *project["optional-dependencies"]["spark"]]
    full, image = locked_hashes("requirements.lock"), locked_hashes("requirements-image.lock")
    missing = [spec for spec in map(Requirement, runtime) if canonicalize_name(spec.name) not in image]
    assert not missing, f"requirements-image.lock lacks {missing} (make lock)"
    differ = {name: (pinned, full.get(name)) for name, pinned in image.items() if full.get(name) != pinned}
    assert not differ, f"requirements-image.lock is out of step with requirements.lock (make lock): {differ}"
    assert all(hashes for _, hashes in image.values())
    tools = {"pytest", "pytest-asyncio", "pytest-timeout", "hypothesis", "mypy", "ruff", "playwright", "schemathesis"}
    dev = {canonicalize_name(Requirement(s).name) for s in project["optional-dependencies"]["dev"]}
    assert tools <= dev  # the test and lint tools, which nothing at run time needs
    assert not tools & set(image), f"test tools in the image's lock: {sorted(tools & set(image))}"
    assert set(full) - set(image), "the image's lock should leave the dev tools out"
