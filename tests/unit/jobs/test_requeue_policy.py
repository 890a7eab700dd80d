"""The requeue decision has one specification, hpcdl.jobs.requeue_policy.verdict, and one
bash copy, the job script's hpcdl_requeue_verdict (templates/sbatch.sh.j2: the batch
host may have no python3). The function is taken from a rendered job script and run
under real bash, with the job's options, over a table whose answers are written out
here, over every combination of a grid of the inputs that matter, and over generated
inputs, each set in one bash process; each answer must be the specification's. A change
to either side alone fails here, and a change to both fails the table."""

from __future__ import annotations

import itertools
import re
import subprocess
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcdl.jobs import requeue_policy as policy
from hpcdl.jobs.requeue_policy import Verdict, verdict
from hpcdl.jobside import requeue as causes
from hpcdl.plan import JobRequest, build_plan
from hpcdl.profiles import load_profile
from tests.unit.jobside.test_causes import rendered

FUNCTION = re.compile(r"^hpcdl_requeue_verdict\(\) \{\n.*?^\}\n", re.M | re.S)
SEP = "\x1f"  # not whitespace: bash's read keeps empty fields between two of these

# (rc, cause, left, lead, progress, used, max_restarts, chain)
Case = tuple[int | None, str, str, int, bool, int, int, int]


def function_text() -> str:
    """hpcdl_requeue_verdict as a job that requeues itself renders it."""
    script = build_plan(load_profile("sandbox"), JobRequest.of(
        nodes=1, gpus=1, run_dir="/scratch/r/x", requeue=True)).script
    found = FUNCTION.findall(script)
    assert len(found) == 1, "the job script defines hpcdl_requeue_verdict once"
    return found[0]


def spec(case: Case) -> Verdict:
    rc, cause, left, lead, progress, used, max_restarts, chain = case
    return verdict(rc, cause, left=left, lead=lead, progress=progress, used=used,
                   max_restarts=max_restarts, chain=chain)


def in_bash(cases: list[Case]) -> list[Verdict]:
    """Each case's verdict from the rendered bash function: one bash process for all,
    under the job script's `set -euo pipefail`."""
    driver = (f"set -euo pipefail\n{function_text()}"
              f"while IFS=$'{SEP}' read -r rc cause left lead progress used max chain end; do\n"
              '  hpcdl_requeue_verdict "$rc" "$cause" "$left" "$lead" "$progress" "$used" '
              '"$max" "$chain"\ndone\n')
    lines = "".join(SEP.join(["" if rc is None else str(rc), cause, left, str(lead),
                              "1" if progress else "0", str(used), str(mx), str(chain),
                              "end"]) + "\n"
                    for rc, cause, left, lead, progress, used, mx, chain in cases)
    res = subprocess.run(["bash", "-c", driver], input=lines, capture_output=True,
                         text=True, timeout=60, check=False)
    assert res.returncode == 0 and not res.stderr, res.stderr[-2000:]
    out = []
    for line in res.stdout.splitlines():
        cause, requeue, key = line.split(" ")
        assert requeue in ("0", "1"), line
        out.append(Verdict(cause, requeue == "1", key))
    assert len(out) == len(cases), "one verdict per case"
    return out


def assert_same(cases: list[Case]) -> None:
    got = in_bash(cases)
    wrong = [(case, bash, spec(case)) for case, bash in zip(cases, got, strict=True)
             if bash != spec(case)]
    assert not wrong, (f"{len(wrong)} of {len(cases)} differ; first (case, bash, python): "
                       f"{wrong[0]}")


C = causes
# (case, what the batch script must decide): the rules of hpcdl/jobside/requeue.py's
# contract, written out.
TABLE: list[tuple[Case, Verdict]] = [
    # The signal: time left against the lead (+ 60 s).
    ((None, "", "100", 60, False, 0, 1, 1), Verdict(C.TIMEOUT, False, policy.SIGNAL)),
    ((None, "", "120", 60, False, 0, 1, 1), Verdict(C.TIMEOUT, False, policy.SIGNAL)),
    ((None, "", "121", 60, False, 0, 1, 1), Verdict(C.PREEMPTED, False, policy.SIGNAL)),
    ((None, "", "none", 60, False, 0, 1, 1), Verdict(C.PREEMPTED, False, policy.SIGNAL)),
    ((None, "", "", 60, False, 0, 1, 1), Verdict(C.PREEMPTED, False, policy.SIGNAL)),
    ((None, "", "0", 60, False, 0, 1, 3), Verdict(C.TIMEOUT, False, policy.SIGNAL)),
    ((None, C.NODES, "0", 60, False, 0, 1, 1), Verdict(C.NODES, False, policy.SIGNAL)),
    # A step that exits 0 completed, signal or not.
    ((0, C.TIMEOUT, "", 60, False, 9, 0, 1), Verdict(C.COMPLETED, False, policy.DONE)),
    ((0, "", "", 60, True, 0, 1, 3), Verdict(C.COMPLETED, False, policy.DONE)),
    # A crash after a step: requeued while restarts last (this one counted).
    ((1, "", "", 60, True, 0, 1, 1), Verdict(C.FAILED, True, policy.REQUEUE)),
    ((1, "", "", 60, True, 1, 1, 1), Verdict(C.FAILED, False, policy.LIMIT)),
    ((1, "", "", 60, True, 0, 0, 1), Verdict(C.FAILED, False, policy.LIMIT)),
    # No step: failed before it (STARTUP) or hung until the limit (STALLED): never requeued.
    ((1, "", "", 60, False, 0, 5, 1), Verdict(C.STARTUP, False, "startup")),
    ((143, C.TIMEOUT, "", 60, False, 0, 5, 1), Verdict(C.STALLED, False, "stalled")),
    # ... unless a checkpoint was promised (exit 85).
    ((85, C.TIMEOUT, "", 60, False, 0, 1, 1), Verdict(C.TIMEOUT, True, policy.REQUEUE)),
    ((85, C.TIMEOUT, "", 60, True, 1, 1, 1), Verdict(C.TIMEOUT, False, policy.LIMIT)),
    # Preemption: always requeued, whatever was done and spent.
    ((143, C.PREEMPTED, "", 60, False, 7, 1, 1), Verdict(C.PREEMPTED, True, policy.REQUEUE)),
    ((85, C.PREEMPTED, "", 60, True, 0, 0, 1), Verdict(C.PREEMPTED, True, policy.REQUEUE)),
    # The node guard's NODES spends a restart; no step does not make it STARTUP.
    ((1, C.NODES, "", 60, False, 0, 1, 1), Verdict(C.NODES, True, policy.REQUEUE)),
    ((1, C.NODES, "", 60, False, 0, 0, 1), Verdict(C.NODES, False, policy.LIMIT)),
    # A chain's job: never requeued by itself, nor judged by its steps.
    ((1, "", "", 60, False, 0, 0, 3), Verdict(C.FAILED, False, policy.CHAIN)),
    ((143, C.TIMEOUT, "", 60, False, 0, 0, 2), Verdict(C.TIMEOUT, False, policy.CHAIN)),
]


def test_the_table() -> None:
    cases = [case for case, _ in TABLE]
    assert [spec(case) for case in cases] == [want for _, want in TABLE]
    assert in_bash(cases) == [want for _, want in TABLE]
    assert {want.key for _, want in TABLE} == set(policy.KEYS)


def test_every_combination_of_a_grid() -> None:
    lead = 60
    cases: list[Case] = list(itertools.product(
        [None, 0, 1, causes.EXIT_REQUEUE, 143],
        ["", causes.TIMEOUT, causes.PREEMPTED, causes.NODES, causes.FAILED],
        ["", "none", "0", str(lead + 60), str(lead + 61)],
        [lead], [False, True], [0, 1, 2], [0, 1, 2], [1, 2, 3]))
    assert_same(cases)


def test_the_function_is_the_same_in_every_job_script() -> None:
    """One function for every flavour of the requeue block (the test above runs one)."""
    texts = {name: FUNCTION.findall(script) for name, script in rendered().items()}
    with_block = {name: found for name, found in texts.items() if found}
    assert set(with_block) == {"requeue", "chain", "spares+requeue", "expedite"}
    assert all(found == [function_text()] for found in with_block.values())


WORDS = st.sampled_from(["", *causes.CAUSES]) | st.from_regex(r"[A-Z_]{1,8}", fullmatch=True)
LEFT = (st.sampled_from(["", "none"]) | st.integers(0, 4000).map(str)
        | st.integers(0, 10**9).map(str)
        | st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=8))
CASES: Any = st.tuples(
    st.none() | st.integers(0, 255) | st.sampled_from([0, 1, causes.EXIT_REQUEUE, 143]),
    WORDS, LEFT, st.integers(0, 3600), st.booleans(), st.integers(0, 20),
    st.integers(0, 20), st.integers(1, 5))


# Examples, each of 50-200 cases in one bash process: the unit profile's few (`make unit`,
# tests/unit/conftest.py), else at most 20.
EXAMPLES = min(20, settings.default.max_examples)


@settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(CASES, min_size=50, max_size=200))
def test_generated_inputs(cases: list[Case]) -> None:
    assert_same(cases)
