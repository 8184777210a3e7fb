"""The shared words: range notation, P2P levels, link order."""
from __future__ import annotations

import pytest

from smartlaunch.vocab import (
    LINK_FAMILIES, STRATEGY_CHOICES, RangeError, format_ranges, link_rank, p2p_level,
    parse_ranges,
)


def test_ranges_round_trip_and_keep_order():
    assert parse_ranges("0-3,8, 10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_ranges("3,1,1") == [3, 1, 1]           # Slurm's allocation order, repeats kept
    assert parse_ranges("") == [] and format_ranges(()) == ""
    assert format_ranges([11, 0, 1, 2, 3, 8, 10, 3]) == "0-3,8,10-11"


@pytest.mark.parametrize("text, descending", [("gpu:2", False), ("1-", False), ("3-1", True)])
def test_ranges_refuse_what_is_not_a_list(text, descending):
    with pytest.raises(RangeError) as exc:
        parse_ranges(text)
    assert exc.value.descending is descending


def test_p2p_levels_by_name_and_nccls_legacy_integers():
    assert [p2p_level(v) for v in ("nvl", " PHB ", "0", "1", "3", "9", "NV", "x")] == \
        ["NVL", "PHB", "LOC", "PIX", "PHB", "SYS", None, None]


def test_link_rank_orders_families_and_puts_unknown_last():
    assert sorted(["SYS", "NV18", "??", "PIX"], key=link_rank) == ["NV18", "PIX", "SYS", "??"]
    assert link_rank("NV4") == link_rank("NV18") == 0 and LINK_FAMILIES[0] == "NV"
    assert STRATEGY_CHOICES[0] == "auto"
