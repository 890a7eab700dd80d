"""hpcdl/schedulers/slurm/states.py: every Slurm state word maps to one of hpcdl's (and an
unknown one to UNKNOWN, whatever its decorations), which states a requeue may follow,
and why an attempt of a requeued job ended."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcdl.jobside import requeue
from hpcdl.schedulers.base import JobState
from hpcdl.schedulers.slurm.states import (
    SLURM_TO_HPCDL,
    attempt_reason,
    may_come_back,
    normalize_slurm_state,
    to_hpcdl,
)


@pytest.mark.parametrize(("raw", "state"), [
    ("CANCELLED by 1000", JobState.CANCELLED), ("COMPLETED+", JobState.COMPLETED),
    ("running", JobState.RUNNING), ("  PENDING  ", JobState.PENDING),
    ("PREEMPTED", JobState.CANCELLED), ("OUT_OF_MEMORY", JobState.FAILED),
    ("DEADLINE", JobState.TIMEOUT), ("STOPPED", JobState.SUSPENDED),
    ("COMPLETING", JobState.RUNNING), ("", JobState.UNKNOWN), ("LAUNCH_FAILED", JobState.UNKNOWN),
])
def test_slurm_words_with_their_decorations(raw, state):
    assert to_hpcdl(raw) == state


@given(st.sampled_from(sorted(SLURM_TO_HPCDL)), st.sampled_from(["", "+", " by 0", " by 42"]),
       st.sampled_from([str.upper, str.lower, str.title]))
def test_any_decoration_or_case_keeps_the_state(word, tail, case):
    assert normalize_slurm_state(case(word) + tail) == word
    assert to_hpcdl(case(word) + tail) == SLURM_TO_HPCDL[word]


@given(st.text(max_size=12))
def test_any_text_maps_to_a_state(raw):
    state = to_hpcdl(raw)
    assert state in set(JobState)
    if normalize_slurm_state(raw) not in SLURM_TO_HPCDL:
        assert state == JobState.UNKNOWN


def test_a_requeue_may_follow_a_preemption_or_a_node_failure_only():
    assert may_come_back("PREEMPTED") and may_come_back("node_fail+")
    assert may_come_back("REQUEUED") and may_come_back("REQUEUE_HOLD")
    assert not may_come_back("CANCELLED by 0") and not may_come_back("TIMEOUT")


@pytest.mark.parametrize(("raw", "last", "cause", "want"), [
    ("NODE_FAIL", False, requeue.PREEMPTED, "NODE_FAIL"),  # the script cannot see it
    ("PREEMPTED", False, "CHECKPOINTED", "CHECKPOINTED"),  # the script's word wins
    ("PREEMPTED", False, None, requeue.PREEMPTED),
    ("OUT_OF_MEMORY", True, None, requeue.FAILED),
    ("BOOT_FAIL", False, None, "NODE_FAIL"),
    ("CANCELLED by 0", True, None, "CANCELLED"),
    ("RUNNING", True, None, "RUNNING"), ("RUNNING", False, None, "REQUEUED"),
    ("REQUEUED", False, None, "REQUEUED"), ("PENDING", True, None, "PENDING"),
    ("LAUNCH_FAILED", True, None, "LAUNCH_FAILED"),
])
def test_why_an_attempt_ended(raw, last, cause, want):
    assert attempt_reason(raw, last=last, script_cause=cause) == want
