"""The benchmarks' results file and the table docs/benchmarks.md makes from it."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_docs import anchors
from tools.bench import report, results


def test_the_page_holds_the_table_the_results_file_makes() -> None:
    page = report.PAGE.read_text()
    assert report.rewrite(page, results.load()) == page, "run: python -m tools.bench.report"


def test_every_entry_of_the_results_file_says_how_where_and_from_what_it_was_measured() -> None:
    fields = {"figure", "value", "unit", "commit", "dirty", "machine", "load_start", "load_end", "date", "command"}
    for entry in results.load():
        assert fields <= entry.keys()
        assert entry["command"].startswith("python -m tools.bench"), entry
        assert entry["machine"]["cores"] and entry["machine"]["memory_gib"], entry


def test_a_session_appends_its_figures_with_commit_machine_and_load(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    results.record("outside.a.session", 1.0, "s")
    with results.session("tallies", ["python", "-m", "tools.bench", "tallies", "--events", "10"], path):
        results.record("tallies.one_worker", 300.0, "events/s", baseline=1200.0)
        results.record("tallies.not_measured", None, "s")
    with results.session("tallies", ["python", "-m", "tools.bench", "tallies"], path):
        results.record("tallies.one_worker", 400.0, "events/s")
    entries = results.load(path)
    assert [e["figure"] for e in entries] == ["tallies.one_worker", "tallies.one_worker"]
    first = entries[0]
    assert first["ratio"] == 0.25
    assert first["command"] == "python -m tools.bench tallies --events 10"
    assert len(first["commit"]) == 40 and isinstance(first["dirty"], bool)
    assert len(first["load_start"]) == 3 and len(first["load_end"]) == 3
    assert results.latest(entries)["tallies.one_worker"]["value"] == 400.0


def test_the_table_shows_the_latest_entry_beside_the_target_and_links_the_log_for_the_rest() -> None:
    figure = report.FIGURES[0]
    assert figure.target is not None
    common = {"unit": figure.unit, "commit": "0" * 40, "dirty": False, "load_start": [1.0], "load_end": [2.0]}
    older = {**common, "figure": figure.id, "value": 1.0, "baseline": 10.0, "ratio": 0.1, "date": "2026-11-28T10:00:00+00:00"}
    newer = {**common, "figure": figure.id, "value": 30.0, "baseline": 10.0, "ratio": 3.0, "date": "2026-11-29T10:00:00+00:00"}
    other = {**common, "figure": "an.undeclared.figure", "value": 5.0, "date": "2026-11-29T11:00:00+00:00"}
    lines = report.table([older, newer, other]).splitlines()
    row = next(line for line in lines if line.startswith(f"| {figure.title} |"))
    assert "**30" in row and "2026-11-29 10:00" in row
    assert ("**met**" if figure.target.met(newer) else "**not met**") in row
    unmeasured = next(line for line in lines if line.startswith(f"| {report.FIGURES[1].title} |"))
    assert f"(benchmarks-log.md#{report.FIGURES[1].log_anchor})" in unmeasured
    assert lines[-1].startswith("| an.undeclared.figure |")


def test_every_figure_links_a_section_of_the_log() -> None:
    sections = anchors(report.PAGE.parent / report.LOG)
    assert not [f.id for f in report.FIGURES if f.log_anchor not in sections]
