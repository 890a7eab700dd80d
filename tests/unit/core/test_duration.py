"""hpcdl/core/duration.py: Slurm's time syntax to seconds and back (property), each form
Slurm takes, and the refusals."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcdl.core.duration import format_time, parse_time


@given(st.integers(1, 400 * 86400))
def test_the_display_form_reads_back_as_the_same_seconds(seconds):
    text = format_time(seconds)
    assert parse_time(text) == seconds
    assert ("-" in text) == (seconds >= 86400)


@pytest.mark.parametrize(("text", "seconds"), [
    ("30", 1800), ("5:30", 330), ("01:02:03", 3723), ("2-3", 2 * 86400 + 3 * 3600),
    ("2-03:04", 2 * 86400 + 3 * 3600 + 240), ("1-00:00:01", 86401), ("0-0:0:5", 5),
    ("90:00", 5400), ("25:00:00", 90000),
])
def test_every_form_slurm_takes(text, seconds):
    assert parse_time(text) == seconds


@pytest.mark.parametrize("text", ["infinite", "UNLIMITED", "Infinite"])
def test_unlimited_is_none_and_shown_as_infinite(text):
    assert parse_time(text) is None
    assert format_time(None) == "infinite"


@pytest.mark.parametrize(("text", "why"), [
    ("0", "not a positive time"), ("00:00:00", "not a positive time"), ("0-0", "not a positive"),
    ("1h", "is not a Slurm time"), ("01:00:00\n", "is not a Slurm time"), ("", "not a Slurm"),
    ("-5", "not a Slurm time"), ("1:2:3:4", "not a Slurm time"), ("1-", "not a Slurm time"),
])
def test_what_is_no_positive_slurm_time_is_refused_with_the_forms(text, why):
    with pytest.raises(ValueError, match=why) as err:
        parse_time(text)
    assert repr(text) in str(err.value)


def test_the_display_form():
    assert format_time(59) == "00:00:59"
    assert format_time(86400) == "1-00:00:00"
    assert format_time(90061) == "1-01:01:01"
