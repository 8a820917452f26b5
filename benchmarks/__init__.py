"""Benchmarks for the ``connectors`` sinks; run one with ``python -m benchmarks.<name>``."""
