"""The look-alike skeleton (issue 27 item 9): what it joins and what it keeps apart."""

from __future__ import annotations

import string

from kiln_registry.domain.alias_skeleton import alias_hazard, alias_skeleton


def test_distinct_ascii_characters_stay_distinct_except_the_tables_own_pairs() -> None:
    chars = string.ascii_lowercase + string.digits + "-_./@:"
    skeletons = {ch: alias_skeleton(ch) for ch in chars}
    joined = {ch for ch in chars if sum(v == skeletons[ch] for v in skeletons.values()) > 1}
    assert joined == {"l", "1"}


def test_case_compatibility_homoglyphs_and_marks_share_one_skeleton() -> None:
    same = ["victim-x", "VICTIM-X", "vi\u0441tim-x", "vict\u0456m-x", "victim\u2010x",
            "\uff56ictim-x", "victi\u0301m-x"]  # fmt: skip
    assert {alias_skeleton(a) for a in same} == {alias_skeleton("victim-x")}
    assert alias_skeleton("\u0139ab") == alias_skeleton("lab") == alias_skeleton("1ab")
    assert alias_skeleton("van") != alias_skeleton("nan")


def test_hazards() -> None:
    assert alias_hazard("qwen/qwen3-8b@vllm") is None
    assert alias_hazard("two words") is None
    for bad in (" a", "a ", "a\u200bb", "a\u200db", "a\u202eb", "a\u2069b", "a\ufeffb",
                "a\u3164b", "a\ufe0fb", "a\u2028b", "a\u00a0b", "a\U000e0041b"):  # fmt: skip
        assert alias_hazard(bad) is not None, repr(bad)
