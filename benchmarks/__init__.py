"""Benchmarks on real data; each module is runnable with ``python -m benchmarks.<name>``."""
