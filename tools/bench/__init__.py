"""Benchmarks (``make bench``). Each area module has ``main(argv)``; results are printed
and recorded by hand, with method and machine, in docs/benchmarks.md."""
