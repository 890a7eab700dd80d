"""One source for the cause words (hpcdl.jobside.requeue: CAUSES): the job script template spells
none of its own, and every word the bash assigns to or compares with $hpcdl_cause (or
reads from attempts.tsv's cause column) - in the rendered scripts and in the staged,
unrendered templates/hpcdl-nodes.sh - is one of causes.CAUSES, and each of ALL is spelt by
the bash somewhere: a word added on either side alone fails here."""

from __future__ import annotations

import re

import pytest

from hpcdl.jobs import attempts
from hpcdl.jobside import requeue as causes
from hpcdl.launch.nodes import nodes_file_text
from hpcdl.plan import JobRequest, build_plan
from hpcdl.profiles import load_profile

# Where bash spells a cause: an assignment, a test, a case branch (of $hpcdl_cause, or of
# $cause in hpcdl_requeue_verdict), attempts.tsv's cause column ($6) in awk, and the
# "(CAUSE); not requeued" lines.
WORD = r"([A-Za-z_][A-Za-z0-9_]*)"
VAR = r"(?:hpcdl_)?cause"
SPELLINGS = [
    re.compile(rf"\b{VAR}={WORD}(?=[\s;]|$)", re.M),
    re.compile(rf"\$\{{?{VAR}\}}?\s*[!=]?=\s*{WORD}(?=[\s\]]|$)", re.M),
    re.compile(rf"\$6\s*[!=]=\s*\"{WORD}\""),
    re.compile(rf"\({WORD}\); not requeued"),
]
CASE = re.compile(rf"case \${VAR} in (.*?)\besac\b", re.S)
CASE_BRANCH = re.compile(rf"(?:^|;;)\s*{WORD}(?:\|{WORD})*\)")


def spelt(text: str) -> set[str]:
    """The cause words bash ``text`` assigns, compares or prints as a cause (comments left
    out)."""
    code = "\n".join(re.sub(r"(^|\s)#.*$", "", line) for line in text.splitlines())
    found = {m.group(1) for pattern in SPELLINGS for m in pattern.finditer(code)}
    for case in CASE.finditer(code):
        for m in CASE_BRANCH.finditer(case.group(1)):
            found |= set(re.findall(WORD, m.group(0)))
    return found


def rendered(monkeypatch: pytest.MonkeyPatch | None = None,
             mark: str = "") -> dict[str, str]:
    """Job scripts with every block that spells a cause: requeue (with and without
    spares, expedite on 26.05), a chain, a node guard without requeue. With ``mark``,
    the template's ``cause`` words are rendered as MARK + word."""
    if monkeypatch is not None:
        marked = {k: ([mark + w for w in v] if isinstance(v, list) else mark + str(v))
                  for k, v in causes.cause_words().items()}
        monkeypatch.setattr("hpcdl.plan.build.cause_words", lambda: marked)
    sandbox = load_profile("sandbox")
    expedite = sandbox.model_copy(update={"scheduler": sandbox.scheduler.model_copy(
        update={"release": "26.05", "requeue_expedite": True})})
    out = {}
    for name, profile, kw in [("requeue", sandbox, {"requeue": True}),
                              ("chain", sandbox, {"chain": 3}),
                              ("spares", sandbox, {"spares": 1}),
                              ("spares+requeue", sandbox, {"spares": 1, "requeue": True}),
                              ("expedite", expedite, {"requeue": True})]:
        plan = build_plan(profile, JobRequest.of(nodes=1, gpus=1, run_dir="/scratch/r/x", **kw))
        out[name] = plan.script
    return out


def test_the_scan_finds_each_way_bash_spells_a_cause() -> None:
    text = ('hpcdl_cause=A\n[[ $hpcdl_cause == B ]]\n[[ $hpcdl_cause != C && x ]]\n'
            "awk '$6 != \"D\" && $6 == \"E\"'\ncase $hpcdl_cause in F) x ;; G) y ;; esac\n"
            'echo "exit 1 (H); not requeued"\n# hpcdl_cause=COMMENT\n[[ -n $hpcdl_cause ]]\n'
            'cause=I\n[[ $cause == J ]]\ncase $cause in K|L) ;; *) x ;; esac\n')
    assert spelt(text) == set("ABCDEFGHIJKL")


def test_the_template_spells_no_cause_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every cause in templates/sbatch.sh.j2 comes from hpcdl.jobside.requeue: rendered
    with marked words, the scripts spell no unmarked one."""
    words = set().union(*(spelt(text) for text in rendered(monkeypatch, "MARKED_").values()))
    assert words == {f"MARKED_{w}" for w in causes.CAUSES}


def test_the_bash_and_python_spell_the_same_causes() -> None:
    scripts = rendered()
    words = {name: spelt(text) for name, text in scripts.items()}
    words["templates/hpcdl-nodes.sh"] = spelt(nodes_file_text())
    unknown = {name: found - set(causes.CAUSES) for name, found in words.items()
               if found - set(causes.CAUSES)}
    assert unknown == {}
    assert set().union(*words.values()) == set(causes.CAUSES)
    assert words["templates/hpcdl-nodes.sh"] == {causes.NODES}


def test_attempts_tsv_is_read_with_the_same_words() -> None:
    assert attempts.NO_STEP == causes.NO_STEP == (causes.STARTUP, causes.STALLED)
    line = attempts.ScriptAttempt.parse(f"7\t0\t1\t2\t3\t{causes.STALLED}\n")
    assert line is not None and line.cause == causes.STALLED
    # The restarts the requeue block counts: every cause but these.
    script = rendered()["requeue"]
    counted = re.search(r"awk -F'\\t' -v j=\"\$hpcdl_job\" '([^']*)'", script)
    assert counted is not None
    assert re.findall(r'\$6 != "(\w+)"', counted.group(1)) == list(causes.SPEND_NO_RESTART)
