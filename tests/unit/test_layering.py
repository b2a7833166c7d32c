"""The product's imports (docs/architecture.md#product-and-tooling): what runs in production
never imports what develops and measures it (``tools``, ``tests``), which the image leaves
out; ``shared`` imports no service or job; a service imports no other service, but for the
topic Job, which reads the validator's and the tallies' topics through their own loaders."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.imports import imported_modules

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("services", "shared", "spark_jobs", "examples", "helm/image")
#: The services each folder of services/ may import besides its own.
OTHER_SERVICES = {"topics": {"validator", "tallies"}}


def sources(*folders: str) -> list[Path]:
    return sorted(path for folder in folders for path in (REPO / folder).rglob("*.py"))


def relative(path: Path) -> str:
    return str(path.relative_to(REPO))


@pytest.mark.parametrize("path", sources(*PRODUCT), ids=relative)
def test_the_product_imports_no_tool_or_test(path: Path) -> None:
    roots = {name.split(".")[0] for name in imported_modules(path)}
    assert not roots & {"tools", "tests"}, f"{relative(path)} imports {sorted(roots & {'tools', 'tests'})}"


@pytest.mark.parametrize("path", sources("shared"), ids=relative)
def test_shared_imports_no_service_or_job(path: Path) -> None:
    roots = {name.split(".")[0] for name in imported_modules(path)}
    assert not roots & {"services", "spark_jobs"}, f"{relative(path)} imports {sorted(roots & {'services', 'spark_jobs'})}"


@pytest.mark.parametrize("path", [p for p in sources("services") if p.parent != REPO / "services"], ids=relative)
def test_a_service_imports_no_other_service(path: Path) -> None:
    own = path.relative_to(REPO / "services").parts[0]
    others = {name.split(".")[1] for name in imported_modules(path) if name.startswith("services.")} - {own}
    assert others <= OTHER_SERVICES.get(own, set()), f"{relative(path)} imports services {sorted(others)}"
