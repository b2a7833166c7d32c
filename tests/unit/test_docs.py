"""The docs stay true to the project: links resolve, the configuration table lists every setting."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from shared.settings import Settings
from tests.support.guide import domain_guide_files, write_files

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_BLOCK = re.compile(r"^```.*?^```", re.S | re.M)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = CODE_BLOCK.sub("", path.read_text())
    return {github_anchor(m) for m in re.findall(r"^#+\s+(.*)$", text, re.M)}


def relative_links(path: Path) -> list[str]:
    text = CODE_BLOCK.sub("", path.read_text())
    return [t for t in LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(doc: Path) -> None:
    broken = []
    for target in relative_links(doc):
        file_part, _, anchor = target.partition("#")
        resolved = (doc.parent / file_part).resolve() if file_part else doc
        if not resolved.exists():
            broken.append(f"{target} (no {resolved.relative_to(REPO) if resolved.is_relative_to(REPO) else resolved})")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target} (no heading #{anchor})")
    assert not broken, f"broken links in {doc.relative_to(REPO)}: {broken}"


def config_table_variables() -> set[str]:
    """Every variable the configuration table (docs/configuration.md, "Settings") names; ``/ `_X``
    continues the previous name."""
    section = REPO.joinpath("docs", "configuration.md").read_text().split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for row in re.findall(r"^\|\s*(`STATEFLEET_[^|]*)\|", section, re.M):
        previous = ""
        for token in re.findall(r"`([^`]+)`", row):
            name = previous.rsplit("_", 1)[0] + token if token.startswith("_") and previous else token
            names.add(name)
            previous = name
    return names


def test_the_configuration_table_lists_exactly_the_settings() -> None:
    settings = {f"STATEFLEET_{name.upper()}" for name in Settings.model_fields}
    table = config_table_variables()
    assert sorted(settings - table) == [], "settings missing from the configuration table (docs/configuration.md)"
    assert sorted(table - settings) == [], "docs/configuration.md's table names variables Settings does not read"


def test_the_domain_guides_code_passes_its_own_tests(tmp_path: Path) -> None:
    """docs/your-domain.md: the tickets domain and projection, written from scratch there, and
    their tests, run as a team runs them: the modules and the tests in a folder of their own,
    outside the repository."""
    files = domain_guide_files("tickets/domain.py", "tickets/projection.py", "test_tickets.py")
    team = write_files({name: text for name, text in files.items() if name.endswith(".py")}, tmp_path / "team")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "pt"), "test_tickets.py"],
        cwd=team,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("STATEFLEET_")},
            "PYTHONPATH": os.pathsep.join([str(team), str(REPO)]),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "4 passed" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-2000:]
