"""Kiln conformance suite: cases taken from Kiln's own sources and tests.

Every case cites the Kiln file (repository ericflo/kiln) its values come from.
Facts only (names, codes, byte layouts, test values); no Kiln code.
"""
