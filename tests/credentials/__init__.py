"""Tests of kiln_registry.credentials."""
