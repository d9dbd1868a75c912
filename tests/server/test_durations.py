"""``lockd.client.durations``: what a person types on the command line, in milliseconds."""

from __future__ import annotations

import pytest

from lockd.client.durations import format_duration, parse_duration


@pytest.mark.parametrize("text, ms", [
    ("500ms", 500), ("30s", 30_000), ("2m", 120_000), ("1h", 3_600_000), ("1m30s", 90_000),
    ("1.5s", 1_500), (".25s", 250), (" 2M ", 120_000), ("0", 0), ("1h1m1s1ms", 3_661_001),
])
def test_parse(text, ms):
    assert parse_duration(text) == ms


@pytest.mark.parametrize("text", ["30", "", "-1s", "1d", "s", "1.5.5s", "1 s", "ms5", "1e3ms"])
def test_parse_rejects(text):
    with pytest.raises(ValueError):
        parse_duration(text)


def test_bare_number_asks_for_a_unit():
    with pytest.raises(ValueError, match="needs a unit"):
        parse_duration("30")


@pytest.mark.parametrize("ms", [0, 1, 250, 1_000, 1_500, 30_000, 59_999, 60_000, 90_000,
                                5_400_000, 3_601_500])
def test_format_round_trips(ms):
    assert parse_duration(format_duration(ms)) == ms
