"""The job-side shell on the bash users' clusters have: RHEL/Rocky 7 and 8 ship bash 4.2
and 4.4, and the job script runs under `set -euo pipefail`. Every test here runs on
Debian's bash 5.2, so what bash 4.2 lacks is caught by reading the scripts (NEWER_BASH);
the guard's functions that parse Slurm's words run under bash with the job's options.
tests/unit/launch/test_nodes_guard.py runs the whole guard against stand-ins for Slurm,
once without bash 5's clocks."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from hpcdl.core.resources import templates_dir
from hpcdl.launch.nodes import guard_calls_text, nodes_file_text
from hpcdl.plan import JobRequest, build_plan
from hpcdl.profiles import load_profile

REPO = Path(__file__).resolve().parents[3]
NODES = templates_dir() / "hpcdl-nodes.sh"

# What bash 4.2 does not have: (what, the bash it needs, a pattern, a line that uses it).
NEWER_BASH = [
    ("EPOCHREALTIME / EPOCHSECONDS, unless read as ${X:-}", "5.0",
     r"\$\{?EPOCH(REALTIME|SECONDS)(?!:-)", "us=${EPOCHREALTIME/./}"),
    ("BASH_ARGV0", "5.0", r"\bBASH_ARGV0\b", 'echo "$BASH_ARGV0"'),
    ("SRANDOM", "5.1", r"\$\{?SRANDOM\b", "n=$SRANDOM"),
    ("${var@Q}-style transformations (@Q @E @P @A @a; @U @u @L @K 5.1+)", "4.4",
     r"\$\{[#!]?\w+(\[[^]]*\])?@[QEPAaULuKk]\}", 'echo "${x@Q}"'),
    ("wait -n / -f / -p", "4.3 (-n), 5.0 (-f), 5.1 (-p)", r"\bwait\s+-[nfp]\b", "wait -n"),
    ("namerefs: local -n / declare -n / typeset -n", "4.3",
     r"\b(local|declare|typeset)\s+-\w*n", "local -n ref=$1"),
    ("mapfile -d / readarray -d", "4.4", r"\b(mapfile|readarray)\b[^\n;|]*\s-d\b",
     "mapfile -d '' -t a"),
    ("negative array subscripts", "4.3", r"\$\{#?\w+\[-[0-9]+\]\}|\b\w+\[-[0-9]+\]=",
     'echo "${a[-1]}"'),
    ("shopt -s inherit_errexit / localvar_inherit / assoc_expand_once", "4.4 / 5.0 / 5.0",
     r"\bshopt\s+-s\s+(inherit_errexit|localvar_inherit|localvar_unset|assoc_expand_once)",
     "shopt -s inherit_errexit"),
    ("local - (options local to a function)", "4.4", r"\blocal\s+-(\s|;|$)", "local -"),
    # "${a[@]}" of an empty array is an unbound variable under set -u before bash 4.4:
    # ${a[@]+"${a[@]}"} (or a default, ${a[*]-}) is the form that holds on 4.2.
    ('"${a[@]}" / "${a[*]}" / "${!a[@]}" without the ${a[@]+...} guard', "4.4 under set -u",
     r"\$\{!?\w+\[[@*]\](?![:]?[-+])", 'hpcdl_join "${nodes[@]}"'),
]
# The one form of an array expansion that is safe when it is empty: its guard removed
# before the scan (${a[@]+"${a[@]}"}, ${a[@]+"${a[@]:0:n}"}, ${a[@]+"${!a[@]}"}).
SAFE_ARRAY = re.compile(r'\$\{(\w+)\[([@*])\]\+"\$\{!?\1\[\2\][^}"]*\}"\}')


def newer_bash(text: str) -> list[str]:
    """The constructs of NEWER_BASH in ``text``, outside comments: "line N: what (bash V)"."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        code = line if line.startswith("#!") else re.sub(r"(^|\s)#.*$", "", line)
        code = SAFE_ARRAY.sub("", code)
        for what, version, pattern, _ in NEWER_BASH:
            if re.search(pattern, code):
                found.append(f"line {number}: {what} (bash {version}): {line.strip()}")
    return found


def job_side_scripts() -> dict[str, str]:
    """Every shell text that runs in a job: the templates as they are, the job scripts a
    plan renders with every block the guard and the requeue block add, the files it stages
    into the run (job/bin), and the rendered goldens."""
    texts = {f"templates/{p.name}": p.read_text() for p in sorted(templates_dir().glob("*.sh"))}
    texts |= {f"templates/{p.name}": p.read_text()
              for p in sorted(templates_dir().glob("*.sh.j2"))}
    for name, kw in {"spares+requeue": {"spares": 1, "requeue": True},
                     "spares": {"spares": 1},
                     "requeue": {"requeue": True}}.items():
        plan = build_plan(load_profile("sandbox"),
                          JobRequest.of(nodes=1, gpus=1, run_dir="/scratch/r/x", **kw))
        texts[f"rendered {name}: job.sbatch"] = plan.script
        for path, text in plan.files.job_scripts:
            texts[f"rendered {name}: {path}"] = text
    for path in sorted((REPO / "tests" / "golden" / "sbatch").glob("*.sh")):
        texts[str(path.relative_to(REPO))] = path.read_text()
    return texts


def test_each_pattern_finds_what_it_names() -> None:
    """The scan is not empty: each entry's example is found, and the safe forms are not."""
    for what, _, _, example in NEWER_BASH:
        assert any(what in f for f in newer_bash(example)), (what, example)
    for safe in ('f ${a[@]+"${a[@]}"}', 'x=(${a[@]+"${a[@]:0:n}"})', 'for k in ${b[@]+"${!b[@]}"}',
                 'echo ${o[*]+"${o[*]}"}', '[[ -n ${s[*]-} ]]', 't=${EPOCHREALTIME:-}',
                 "echo ${#a[@]}", "x=${a[0]}  # ${a[@]} in a comment", "local -a xs"):
        assert newer_bash(safe) == [], safe


def test_no_job_side_script_needs_a_bash_newer_than_4_2() -> None:
    found = {name: hits for name, text in job_side_scripts().items()
             if (hits := newer_bash(text))}
    assert found == {}


def test_the_guard_is_sourced_and_run_under_the_options_its_harness_uses() -> None:
    """test_nodes_guard's DRIVER runs the guard as job.sbatch does: sourced and set up
    under `set -euo pipefail`, supervised after `set +e`."""
    script = build_plan(load_profile("sandbox"), JobRequest.of(
        nodes=1, gpus=1, run_dir="/scratch/r/x", spares=1)).script
    lines = script.splitlines()
    strict, source = lines.index("set -euo pipefail"), lines.index("source /scratch/r/x/job/bin/hpcdl-nodes")
    relax, supervise = lines.index("set +e"), lines.index("hpcdl_supervise")
    assert strict < source < lines.index("hpcdl_nodes_init 1") < relax < supervise


def bash(code: str, env: dict[str, str] | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """``code`` after sourcing the guard, under the job script's options."""
    return subprocess.run(["bash", "-c", f'set -euo pipefail\nsource "$NODES"\n{code}'],
                          capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, "NODES": str(NODES), **(env or {})})


# squeue %L's words (Slurm's secs2time_str) and --time's forms, as seconds.
LEFT = {
    "UNLIMITED": "none", "NOT_SET": "none", "INFINITE": "none",
    "1-00:00:00": "86400", "2-03:04:05": str(2 * 86400 + 3 * 3600 + 4 * 60 + 5),
    "0-00:00:59": "59", "1-02": str(86400 + 7200), "1-02:03": str(86400 + 7200 + 180),
    "12:34:56": str(12 * 3600 + 34 * 60 + 56), "01:02:03": "3723",
    "10:00": "600", "08:09": "489", "0:30": "30", "45": "2700",
    "INVALID": "", "": "", "1-xx": "", " 5:00 ": "300",
}


def test_time_left_is_read_as_slurm_writes_it() -> None:
    """One reading for the guard and the requeue block: UNLIMITED and NOT_SET are no limit
    (not 0 s), a day is 86400 s (not 216000), 08 and 09 are decimal (not bad octal)."""
    code = "".join(f'printf "%s|%s\\n" {t!r} "$(hpcdl_left_seconds {t!r})"\n' for t in LEFT)
    res = bash(code)
    assert res.returncode == 0, res.stderr
    got = dict(line.split("|") for line in res.stdout.splitlines())
    assert got == LEFT


def test_the_requeue_block_carries_the_same_reading() -> None:
    text = guard_calls_text()
    assert text in nodes_file_text()
    assert "hpcdl_left_seconds() {" in text and "hpcdl_slurm() {" in text
    script = build_plan(load_profile("sandbox"), JobRequest.of(
        nodes=1, gpus=1, run_dir="/scratch/r/x", requeue=True)).script
    assert script.count(text) == 1 and "awk -F'[-:]'" not in script
    # With spares the block uses hpcdl-nodes' own, sourced: not a second copy.
    spares = build_plan(load_profile("sandbox"), JobRequest.of(
        nodes=1, gpus=1, run_dir="/scratch/r/x", requeue=True, spares=1)).script
    assert "hpcdl_left_seconds() {" not in spares and "left=$(hpcdl_time_left)" in spares


BAD_STATES = ["down", "down*", "drain", "drng", "drained", "draining", "fail", "failg",
              "failing", "mix*", "alloc*", "idle~", "mix%", "alloc!", "reboot^", "boot",
              "DRAIN", "mixed+drain", "allocated+drain*", "inval", "pow_dn"]
GOOD_STATES = ["alloc", "allocated", "mix", "mixed", "idle", "comp", "completing", "mix-",
               "alloc$", "mix@", "resv", "reserved", "maint", "plnd", "idle#", "npc"]


def test_node_states_the_training_must_leave() -> None:
    """sinfo's compact (%t) and long spellings, with Slurm's flag suffixes: draining
    (drng), drained, down, failing, not responding (*), powered off or going (~ % !),
    rebooting (^) are bad; a maintenance reservation ($), a reboot when next idle (@),
    planned (-), powering up (#) are not."""
    code = "".join(f'hpcdl_state_bad {s!r} && echo "bad {s}" || echo "good {s}"\n'
                   for s in BAD_STATES + GOOD_STATES)
    res = bash(code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [f"bad {s}" for s in BAD_STATES] + \
        [f"good {s}" for s in GOOD_STATES]


def test_a_slurm_command_that_does_not_answer_is_ended_and_named(tmp_path: Path) -> None:
    """A stuck scontrol (slurmctld gone; it may ignore TERM while it retries) is KILLed
    HPCDL_KILL_S s after its bound, and the job's log says which call and why."""
    (tmp_path / "scontrol").write_text("#!/bin/bash\ntrap '' TERM\nwhile :; do sleep 0.1; done\n")
    (tmp_path / "scontrol").chmod(0o755)
    t0 = time.monotonic()
    res = bash('hpcdl_slurm scontrol update JobId=7 NodeList=a || echo "rc=$?"',
               env={"PATH": f"{tmp_path}:{os.environ['PATH']}", "HPCDL_SLURM_TIMEOUT": "1",
                    "HPCDL_KILL_S": "1"})
    took = time.monotonic() - t0
    assert res.stdout.strip() == "rc=137" and took < 10, (res.stdout, took)
    assert res.stderr == "hpcdl: scontrol update JobId=7 NodeList=a failed (no answer in 1 s)\n"


@pytest.mark.parametrize("bash5", [True, False])
def test_the_clock_with_and_without_epochrealtime(bash5: bool) -> None:
    """Milliseconds from bash 5's EPOCHREALTIME, or from date where the shell has none
    (unset here: bash 5 then treats it as bash 4.4 does, an unset variable)."""
    res = bash(("" if bash5 else "unset EPOCHREALTIME EPOCHSECONDS\n")
               + 'a=$(hpcdl_ms); sleep 0.2; b=$(hpcdl_ms); echo "$a $b $(hpcdl_now)"')
    assert res.returncode == 0, res.stderr
    a, b, now = map(int, res.stdout.split())
    assert 150 <= b - a < 2000 and abs(a / 1000 - now) < 5
