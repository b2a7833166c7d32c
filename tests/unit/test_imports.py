"""Every module of the project imports: a stale import (a module moved or renamed) fails here,
not when a worker, a job or a benchmark first loads it."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

PACKAGES = ("services", "shared", "spark_jobs", "tools", "examples")
#: Modules that run in an environment of their own (the Quix Streams peer's virtualenv).
OTHER_ENVIRONMENTS = {"tools.bench.peers.quix_tallies"}


def modules() -> list[str]:
    names: list[str] = []
    for package in PACKAGES:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
            if not info.name.endswith("__main__") and info.name not in OTHER_ENVIRONMENTS:  # __main__ runs its program
                names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("name", modules())
def test_module_imports(name: str) -> None:
    importlib.import_module(name)
