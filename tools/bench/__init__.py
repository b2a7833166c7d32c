"""Benchmarks (``make bench``). Each area module has ``main(argv)``; it prints its figures and
records them (:mod:`tools.bench.results`) in docs/bench-results.jsonl, whose latest entries
:mod:`tools.bench.report` makes into the table of docs/benchmarks.md."""
