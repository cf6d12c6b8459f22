"""The pure parts of windowed aggregations: window assignment, closing, sessions (no Spark)."""

from __future__ import annotations

import pytest

from lakehouse.tables.windowed import Placement, format_duration, sessionize, time_windows


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0s"),
        (1500, "1500ms"),
        (30_000, "30s"),
        (90_000, "90s"),
        (60_000, "1m"),
        (7_200_000, "2h"),
        (86_400_000, "1d"),
    ],
)
def test_format_duration(ms: int, text: str) -> None:
    assert format_duration(ms) == text


def test_tumbling_window_is_aligned_to_the_epoch_and_end_exclusive() -> None:
    assert time_windows(59_999, 60_000, 60_000) == [(0, 60_000)]
    assert time_windows(60_000, 60_000, 60_000) == [(60_000, 120_000)]


def test_hopping_record_falls_in_every_window_covering_it() -> None:
    # size 2m, advance 1m: a record at 1m30s is in [0, 2m) and [1m, 3m)
    assert time_windows(90_000, 120_000, 60_000) == [(0, 120_000), (60_000, 180_000)]
    # size 5, advance 2 (not a divisor): starts ..., 2, 4, 6 cover 6 -> [2,7), [4,9), [6,11)
    assert time_windows(6, 5, 2) == [(2, 7), (4, 9), (6, 11)]
    assert time_windows(7, 5, 2) == [(4, 9), (6, 11)]
    # no window starts before the epoch (Kafka's TimeWindows.windowsFor)
    assert time_windows(10_000, 120_000, 60_000) == [(0, 120_000)]
    assert time_windows(1, 5, 2) == [(0, 5)]


def test_sessions_grow_and_a_bridging_record_merges_two() -> None:
    gap, grace = 5, 100
    stored_rows = [(0, 2), (0, 2), (10, 10)]  # two sessions: [0,2] (2 records) and [10,10]
    stored, new = sessionize(stored_rows, [(6, 10), (30, 30)], gap, grace)
    assert stored == [Placement("changed", 0, 10)] * 3
    assert new == [Placement("changed", 0, 10), Placement("changed", 30, 30)]


def test_a_record_inside_a_session_changes_it_in_place_and_untouched_ones_stay() -> None:
    stored, new = sessionize([(0, 4), (20, 20)], [(3, 20)], gap=5, grace=100)
    assert stored == [Placement("changed", 0, 4), Placement("member", 20, 20)]
    assert new == [Placement("changed", 0, 4)]


def test_gap_is_inclusive_and_merges_chain_within_a_batch() -> None:
    _, new = sessionize([], [(0, 0), (10, 10), (5, 10)], gap=5, grace=100)
    assert new == [Placement("changed", 0, 10)] * 3
    # without grace, [0,0] closed when stream time reached 10: 5 joins only [10,10]
    _, new = sessionize([], [(0, 0), (10, 10), (5, 10)], gap=5, grace=0)
    assert new == [Placement("changed", 0, 0), *[Placement("changed", 5, 10)] * 2]


def test_late_session_record_uses_kafkas_strict_rule() -> None:
    gap, grace = 5, 1
    # stream time 30: a record at 24 is accepted (24 + 6 = 30, not < 30), one at 23 is late
    _, new = sessionize([], [(30, 30), (24, 30)], gap, grace)
    assert new[1] == Placement("changed", 24, 24)
    # 23 alone would be late, but it joins [24,24], which is still open
    _, new = sessionize([], [(30, 30), (24, 30), (23, 30)], gap, grace)
    assert new[1:] == [Placement("changed", 23, 24)] * 2
    _, new = sessionize([], [(30, 30), (23, 30)], gap, grace)
    assert new[1] == Placement("late", 23, 23)


def test_a_closed_session_is_final_and_not_merged_again() -> None:
    gap, grace = 5, 1
    # [0,0] closed once stream time passes 6: a record at 4 cannot join it (nor is it on time)
    stored, new = sessionize([(0, 0)], [(20, 20), (4, 20)], gap, grace)
    assert stored == [Placement("member", 0, 0)]
    assert new == [Placement("changed", 20, 20), Placement("late", 4, 4)]
    # a record within gap of a closed session and of an open one joins the open one only
    stored, new = sessionize([(0, 0), (10, 10)], [(15, 15), (5, 15)], gap, grace)
    assert stored == [Placement("member", 0, 0), Placement("changed", 5, 15)]
    assert new == [Placement("changed", 5, 15), Placement("changed", 5, 15)]
