"""Test support shipped with the package: tiny model builders (``tiny_models``).

Used by the test suite, benchmarks and ``kiln demo``.  Importing this package
imports nothing heavy; torch and transformers load inside the builders.
"""
