"""Every difference between the Slurm releases hpcdl knows, in one table (issue 41).

The adapter reads the release once per connection (``sbatch --version``:
``slurm 24.11.5``, Debian's ``slurm-wlm 24.11.5``) and asks this module how that
release behaves; nothing else in hpcdl compares Slurm versions. The facts are SchedMD's
RELEASE_NOTES and CHANGELOG:

- ``cpus_per_task_env``: 22.05 made srun stop inheriting the batch job's
  --cpus-per-task and read SRUN_CPUS_PER_TASK instead; 23.11 went back to
  SLURM_CPUS_PER_TASK and ignores SRUN_CPUS_PER_TASK. Measured on the 24.11.5 and
  26.05.5 sandboxes (a job of -c 4): srun takes 4 by itself (SLURM_TRES_PER_TASK=cpu=4,
  with SLURM_CPUS_PER_TASK unset too), ignores SRUN_CPUS_PER_TASK=2, and stops with
  "cpus-per-task set by two different environment variables" when SLURM_CPUS_PER_TASK
  differs from SLURM_TRES_PER_TASK; an explicit ``srun -c`` wins over both. So the
  job script keeps Slurm's own value (``${SLURM_CPUS_PER_TASK:-N}``), never another.
- ``gpus_exclusive``: from 26.05, ``--gres=gpu:N`` and ``--gpus-per-node`` are mutually
  exclusive in one request.
- ``tres_bind``: GPU binding is spelled ``--tres-bind`` from 23.11 (``--gpu-bind``
  before).
- ``requeue_expedite``: ``--requeue=expedite`` exists from 25.11 (and acts only where
  slurm.conf has ``SlurmctldParameters=enable_expedited_requeue``: sbatch(1)).
- ``no_kill_step_bug``: after a node fails in a ``--no-kill`` job, later steps may not
  get all the remaining resources; fixed in 23.02.3, never in 22.05. hpcdl's relaunch
  does not meet it (tests/integration/test_no_kill_relaunch.py, on 22.05.8: the
  relaunched step got every CPU and GPU of the survivor and the spare, whether the guard
  gave the dead node back or Slurm declared it down first): it runs with ``--overlap``,
  which the old step, left on the survivor while its dead node cannot report its end,
  cannot block (measured: a step without it, plain or ``--exact``, pends there until
  Slurm declares the node down), and with explicit ``--nodes``/``--ntasks``/
  ``--nodelist``. Kept as a fact of the release, for the table and doctor.
- ``sigterm_teardown``: from 26.05 the other tasks of a step that one task left with a
  non-zero exit get SIGCONT + SIGTERM and KillWait, no longer SIGKILL at once.

Pure: no command runs here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from hpcdl.errors import ValidationError


@dataclass(frozen=True)
class Behaviour:
    """How one Slurm release (YY.MM) behaves where hpcdl depends on it."""

    release: str
    cpus_per_task_env: str
    gpus_exclusive: bool
    tres_bind: bool
    requeue_expedite: bool
    no_kill_step_bug: bool
    sigterm_teardown: bool


def _row(release: str) -> Behaviour:
    key = _key(release)
    return Behaviour(
        release=release,
        cpus_per_task_env="SLURM_CPUS_PER_TASK" if key >= (23, 11) else "SRUN_CPUS_PER_TASK",
        gpus_exclusive=key >= (26, 5),
        tres_bind=key >= (23, 11),
        requeue_expedite=key >= (25, 11),
        # The fix is 23.02.3: a 23.02 cluster's micro version decides (behaviour_of).
        no_kill_step_bug=key <= (23, 2),
        sigterm_teardown=key >= (26, 5),
    )


def _key(release: str) -> tuple[int, int]:
    year, month = release.split(".")
    return int(year), int(month)


# SchedMD's releases from 22.05 on (two a year from 23.02: Feb/May, Nov).
KNOWN: dict[str, Behaviour] = {r: _row(r) for r in (
    "22.05", "23.02", "23.11", "24.05", "24.11", "25.05", "25.11", "26.05")}
OLDEST, NEWEST = min(KNOWN, key=_key), max(KNOWN, key=_key)

# "slurm 24.11.5", "slurm-wlm 24.11.5", "slurm 25.11.0-0rc1": the first X.Y.Z.
_VERSION = re.compile(r"(?:^|\s)(\d{2})\.(\d{2})\.(\d+)")


@dataclass(frozen=True)
class Release:
    """The release a cluster runs: its version, the behaviour hpcdl uses, and a note
    (one line) when hpcdl does not know the release and uses another's behaviour."""

    version: str
    behaviour: Behaviour
    note: str | None = None


def parse_version(text: str) -> tuple[int, int, int]:
    """(year, month, micro) from ``sbatch --version``'s output. Raises ValidationError
    naming the text when it holds no version."""
    m = _VERSION.search(text)
    if m is None:
        raise ValidationError(f"slurm version: {text.strip()[:80]!r} (from `sbatch "
                              f"--version`) holds no YY.MM.N version")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def release_of(version_text: str, tried: str = "sbatch --version") -> Release:
    """The Release ``version_text`` names. A known release gets its row. An unknown one
    gets a note naming it and what was tried: older than 22.05 takes 22.05's behaviour
    (the SRUN_ variable is ignored by an older srun; the --no-kill bug is assumed, which
    only makes hpcdl more careful); newer than 26.05 takes 26.05's (``--requeue=expedite``
    is used only where the cluster's config enables it, which a release without it
    cannot).
    Between two known releases (a version SchedMD never made), the older one's."""
    year, month, micro = parse_version(version_text)
    release = f"{year:02d}.{month:02d}"
    version = f"{release}.{micro}"
    row = KNOWN.get(release)
    if row is not None:
        if release == "23.02" and micro >= 3:
            row = replace(row, no_kill_step_bug=False)
        return Release(version, row)
    key = (year, month)
    if key < _key(OLDEST):
        nearest = KNOWN[OLDEST]
    elif key > _key(NEWEST):
        nearest = KNOWN[NEWEST]
    else:
        nearest = KNOWN[max((r for r in KNOWN if _key(r) < key), key=_key)]
    note = (f"Slurm {version} (from `{tried}`) is not a release hpcdl knows "
            f"({OLDEST} to {NEWEST}): hpcdl uses {nearest.release}'s behaviour")
    return Release(version, nearest, note)



def profile_behaviour(release: str | None) -> Behaviour:
    """How the cluster of a profile whose ``scheduler.release`` is ``release`` behaves,
    for rendering its scripts without asking Slurm (--dry-run and the goldens stay
    deterministic). None (a profile written before hpcdl knew releases): 22.05's, the
    scripts hpcdl has always rendered. A YY.MM hpcdl does not know: the nearest known
    release's, as release_of says."""
    if release is None:
        return KNOWN[OLDEST]
    return release_of(f"{release}.0", tried="the profile's scheduler.release").behaviour


def expedite_enabled(slurmctld_parameters: str) -> bool:
    """Whether ``scontrol show config``'s SlurmctldParameters value (comma-separated,
    ``(null)`` when unset) enables ``--requeue=expedite``."""
    return "enable_expedited_requeue" in (p.strip() for p in slurmctld_parameters.split(","))


def differences(b: Behaviour) -> list[str]:
    """What hpcdl does differently on a cluster of ``b``'s release than on 22.05's, one
    line each (profiles detect, doctor, the docs' table)."""
    lines = []
    if b.cpus_per_task_env != "SRUN_CPUS_PER_TASK":
        lines.append(f"the job keeps Slurm's {b.cpus_per_task_env} (srun inherits the job's "
                     "CPUs per task again from 23.11; 22.05's SRUN_CPUS_PER_TASK is ignored)")
    if b.gpus_exclusive:
        lines.append("one GPU request per job: --gres=gpu:N and --gpus-per-node are mutually "
                     "exclusive from 26.05 (hpcdl refuses a profile that adds the other)")
    if b.requeue_expedite:
        lines.append("requeued jobs ask for --requeue=expedite where the cluster enables it "
                     "(scheduler.requeue_expedite: SlurmctldParameters=enable_expedited_requeue)")
    if not b.no_kill_step_bug:
        lines.append("no --no-kill step bug (fixed in 23.02.3): a relaunch after a node "
                     "death gets the surviving nodes' resources")
    if b.sigterm_teardown:
        lines.append("a step's other tasks get SIGTERM and KillWait after one fails "
                     "(26.05), no longer SIGKILL at once")
    return lines


# What the release matrix (tests/integration, marker slurm_matrix) ran and passed on each
# release's sandbox, case -> {release: the test module}; a release not named: not run
# there (the docs' table says so). Kept by hand with the tests: a case goes in once it
# passed on that release.
_MATRIX_TESTS = "test_slurm_matrix.py"
_REQUEUE_TESTS = "test_slurm_matrix_requeue.py"
_USERS_TESTS = "test_slurm_matrix_users.py"
MATRIX: tuple[tuple[str, dict[str, str]], ...] = (
    ("native 2-node run, status, logs", dict.fromkeys(("22.05", "24.11", "26.05"),
                                                      _MATRIX_TESTS)),
    ("the job's accounting (sacct) through hpcdl status", dict.fromkeys(
        ("22.05", "24.11", "26.05"), _MATRIX_TESTS)),
    ("cancel of a running job", dict.fromkeys(("22.05", "24.11", "26.05"), _MATRIX_TESTS)),
    ("a sweep array task's status", dict.fromkeys(("22.05", "24.11", "26.05"),
                                                  _MATRIX_TESTS)),
    ("alloc", dict.fromkeys(("22.05", "24.11", "26.05"), _MATRIX_TESTS)),
    ("profiles detect", dict.fromkeys(("22.05", "24.11", "26.05"), _MATRIX_TESTS)),
    ("the example in the image, 2 nodes (DDP)", dict.fromkeys(("22.05", "24.11", "26.05"),
                                                              _MATRIX_TESTS)),
    ("a sweep array's failed point, --retry-failed", dict.fromkeys(
        ("22.05", "24.11", "26.05"), _MATRIX_TESTS)),
    ("hpcdl probe on 2 nodes (native, Gloo)", dict.fromkeys(("22.05", "24.11", "26.05"),
                                                            _MATRIX_TESTS)),
    ("the hang dump (--hang-timeout, native, py-spy)", dict.fromkeys(
        ("22.05", "24.11", "26.05"), _MATRIX_TESTS)),
    ("spares: a node dies, the relaunch gets every CPU and GPU",
     dict.fromkeys(("22.05", "24.11", "26.05"), "test_no_kill_relaunch.py")),
    ("requeue: the batch host dies", {"22.05": f"{_REQUEUE_TESTS}; plain requeue, a "
                                               "3-node cluster of its own",
                                      "24.11": f"{_REQUEUE_TESTS}; plain requeue",
                                      "26.05": f"{_REQUEUE_TESTS}; expedite, no hold"}),
    ("requeue: NODE_FAIL without spares", {"22.05": "test_spares.py",
                                           "24.11": _REQUEUE_TESTS,
                                           "26.05": f"{_REQUEUE_TESTS}; expedite, no hold"}),
    ("requeue: preemption", {"22.05": "test_requeue.py", "24.11": _REQUEUE_TESTS,
                             "26.05": _REQUEUE_TESTS}),
    ("requeue: time limit", {"22.05": "test_requeue.py", "24.11": _REQUEUE_TESTS,
                             "26.05": _REQUEUE_TESTS}),
    ("a job hpcdl does not requeue ends FAILED", {"22.05": "test_requeue.py",
                                                  "24.11": _REQUEUE_TESTS,
                                                  "26.05": f"{_REQUEUE_TESTS}; Requeue=0 "
                                                           "first, else REQUEUE_HOLD"}),
    ("a job stopped before its requeue block (dataset mount) ends FAILED",
     {"24.11": _REQUEUE_TESTS, "26.05": f"{_REQUEUE_TESTS}; Requeue=0 first, else REQUEUE_HOLD"}),
    ("as the ordinary user: a 2-node run, its logs", {
        "22.05": "test_cluster_user.py", "24.11": _USERS_TESTS, "26.05": _USERS_TESTS}),
    ("from the laptop (SSH login node): a 2-node run, its logs", {
        "22.05": "test_remote.py", "24.11": f"{_USERS_TESTS}; scheduler.commands over SSH",
        "26.05": f"{_USERS_TESTS}; scheduler.commands over SSH"}),
)


def feature_table(names: tuple[str, ...] = ("22.05", "24.11", "26.05")) -> str:
    """The feature x release table of docs/guide/slurm-releases.md (markdown): for each
    thing that differs, what hpcdl does on each release, from this module's rows
    (scripts/release_table.py writes it into the page; a unit test keeps it current)."""
    rows = [KNOWN[n] for n in names]

    def cells(fn) -> str:  # type: ignore[no-untyped-def]
        return " | ".join(fn(b) for b in rows)

    lines = [
        "| what | " + " | ".join(f"Slurm {n}" for n in names) + " |",
        "|---|" + "---|" * len(names),
        "| srun's CPUs per task | " + cells(
            lambda b: "job exports SRUN_CPUS_PER_TASK (srun does not inherit -c)"
            if b.cpus_per_task_env == "SRUN_CPUS_PER_TASK"
            else "inherited (SLURM_TRES_PER_TASK); job keeps Slurm's SLURM_CPUS_PER_TASK") + " |",
        "| GPUs per node | " + cells(
            lambda b: "one request (scheduler.gpu_request); a second in extra_options refused"
            if b.gpus_exclusive else "scheduler.gpu_request (--gres=gpu:N or --gpus-per-node)")
        + " |",
        "| requeue | " + cells(
            lambda b: "--requeue=expedite where scheduler.requeue_expedite (the cluster's "
                      "enable_expedited_requeue; a job hpcdl does not requeue sets "
                      "Requeue=0 before its non-zero exit, a staging, dataset mount or "
                      "probe-first failure's too), else --requeue"
            if b.requeue_expedite else "--requeue (no expedite in this release)") + " |",
        "| relaunch after a node death (--no-kill) | " + cells(
            lambda b: "Slurm bug (fixed 23.02.3) not met: the relaunch (srun --overlap) gets "
                      "every CPU and GPU of the survivor and the spare"
            if b.no_kill_step_bug else "no known step bug; the relaunch gets every CPU and "
                                       "GPU of the survivor and the spare") + " |",
        "| a step's other tasks after one fails | " + cells(
            lambda b: "SIGCONT + SIGTERM, KillWait" if b.sigterm_teardown
            else "SIGKILL at once") + " |",
    ]
    lines += [f"| tested: {case} | " + " | ".join(
        f"passed ({ran[n]})" if n in ran else "not run" for n in names) + " |"
        for case, ran in MATRIX]
    return "\n".join(lines) + "\n"
