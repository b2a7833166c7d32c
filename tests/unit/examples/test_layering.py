"""``examples/`` is written as a team's own package would be: it imports ``shared`` (the
domain API) and libraries, never a service, a Spark job or a tool."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.imports import imported_modules

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
FORBIDDEN = {"services", "spark_jobs", "tools", "tests"}


@pytest.mark.parametrize("path", sorted(EXAMPLES.rglob("*.py")), ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_examples_import_shared_only(path: Path) -> None:
    roots = {name.split(".")[0] for name in imported_modules(path)}
    assert not roots & FORBIDDEN, f"{path} imports {sorted(roots & FORBIDDEN)}"
