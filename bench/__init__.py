"""Benchmarks, run as modules from the repository root: ``python -m bench.bench_sim``,
``python -m bench.bench_fleet``."""
