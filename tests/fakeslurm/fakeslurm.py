#!/usr/bin/env python3
"""A fake Slurm for fast lifecycle tests: sbatch, squeue, sacct, scontrol, scancel and
sinfo in one stdlib-only script, picked by the name it is called under (bin/ holds one
small wrapper per tool). It is no substitute for the real sandbox (tests/integration):
it only lets submit, follow, failure reports, timeouts, cancellation and sweeps run in
milliseconds, with scripted outcomes.

State lives in ``$FAKE_SLURM_DIR``:
    scenario.json   how jobs progress (written by the test; see DEFAULT below)
    jobs.json       the jobs submitted so far and the clock
    calls.jsonl     one line per command run ({"tool": ..., "argv": [...]}), for counting

Time is counted in *ticks*: every squeue call advances the clock by one, unless a
file ``clock`` in the state directory holds the time (seconds, written by whoever
drives the fake, e.g. bench/bench_polling.py's simulated clock). A job's ``states``
list says how many ticks it spends in each state; the last one is final. A job
named ``<prefix>-<i>`` may add ``spread * (i % 7)`` ticks to its second state, so
the ends of many jobs are spread out. A scenario picks a job's behaviour by its job name (``jobs``: name -> spec,
first match by prefix), else ``default``:

    {"default": {"states": [["PENDING", 1], ["RUNNING", 2], ["COMPLETED", 0]],
                 "exit": "0:0", "stdout": "hello\\n", "stderr": ""},
     "jobs": {"crash": {"states": [["RUNNING", 1], ["FAILED", 0]], "exit": "1:0", ...}},
     "refuse": null,          # or Slurm's refusal message: sbatch exits 1 with it
     "min_job_age": 3,        # ticks a finished job stays visible to squeue
     "sacct_lag": 1,          # ticks sacct shows its placeholder row after the end
     "max_array_size": 1001}  # MaxArraySize in `scontrol show config` (Slurm's default):
                              # sbatch refuses an --array index at or above it, as Slurm does

A requeued job's states pass through PREEMPTED, NODE_FAIL or REQUEUED and back to
PENDING under the same id; ``sacct -D`` then lists one row per ended attempt first.

``sbatch --array=SPEC`` makes one job per task, ``<id>_<index>`` (as squeue -r and sacct
print them), started in waves of the ``%M`` throttle; ``task_specs`` ({"100_3": spec})
gives one task its own outcome. An array's id stands for all its tasks in squeue -j,
sacct -j and scancel.

A job's stdout/stderr (with %j, %A, %a, %3a replaced) are written where its #SBATCH --output/--error
lines say, when it reaches its final state.

The hang watchdog's side: a job spec's ``pids`` ({"rank-0": "n1 100", ...})
are written at submission into the script's $HPCDL_PID_DIR, as the rank wrapper would,
and its ``run_files`` ({"hang/diagnosis.json": "...", ...}) into its $HPCDL_RUN_DIR, as
the job's own watchdog would;
``srun --overlap`` prints the spec's ``srun`` ({"n1": "output", ...}) for the node it
names (--nodelist=), exit 0, and fails like Slurm for a job that is not running.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any, TextIO

DEFAULT: dict[str, Any] = {
    "states": [["PENDING", 1], ["RUNNING", 2], ["COMPLETED", 0]],
    "exit": "0:0", "stdout": "", "stderr": "",
}
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
# The sandbox's partitions (scripts/sandbox.sh), so the live check passes for its profile.
PARTITIONS = "".join(
    f"PartitionName={name} MaxNodes={nodes} MaxTime={limit} Nodes=n[1-2] TotalNodes=2\n"
    for name, nodes, limit in (("debug", 2, "00:30:00"), ("gpu", 2, "02:00:00"),
                               ("short", 1, "00:05:00"), ("lowprio", 2, "00:10:00"),
                               ("urgent", 2, "00:05:00")))
MAX_ARRAY_SIZE = 1001  # Slurm's default, the sandbox's too
SINFO = ("debug*|gpu:fake:4|8|2\ngpu|gpu:fake:4|8|2\nshort|gpu:fake:4|8|2\n"
         "lowprio|gpu:fake:4|8|2\nurgent|gpu:fake:4|8|2\n")


def state_dir() -> Path:
    return Path(os.environ["FAKE_SLURM_DIR"])


def scenario() -> dict[str, Any]:
    path = state_dir() / "scenario.json"
    return json.loads(path.read_text()) if path.is_file() else {}


class Store:
    """jobs.json under an exclusive lock (tools may run concurrently)."""

    def __enter__(self) -> dict[str, Any]:
        self.lock = open(state_dir() / "lock", "a+")  # noqa: SIM115
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        path = state_dir() / "jobs.json"
        self.data = json.loads(path.read_text()) if path.is_file() else {"tick": 0, "next": 100,
                                                                         "jobs": {}}
        clock = state_dir() / "clock"
        self.data["external"] = clock.is_file()
        if self.data["external"]:
            self.data["tick"] = float(clock.read_text())
        return self.data

    def __exit__(self, *exc: object) -> None:
        tmp = state_dir() / "jobs.json.tmp"
        tmp.write_text(json.dumps(self.data))
        tmp.replace(state_dir() / "jobs.json")
        fcntl.flock(self.lock, fcntl.LOCK_UN)
        self.lock.close()


def spec_for(name: str, scen: dict[str, Any]) -> dict[str, Any]:
    for prefix, spec in scen.get("jobs", {}).items():
        if name.startswith(prefix):
            return {**DEFAULT, **spec}
    return {**DEFAULT, **scen.get("default", {})}


def where(job: dict[str, Any], tick: int) -> tuple[str, int | None]:
    """(Slurm state, tick it became final or None) of ``job`` at ``tick``."""
    if job.get("cancelled_at") is not None:
        return "CANCELLED", job["cancelled_at"]
    age = tick - job["submitted"]
    at = job["submitted"]
    for state, ticks in job["states"][:-1]:
        if age < ticks:
            return state, None
        age -= ticks
        at += ticks
    return job["states"][-1][0], at


def finish(job: dict[str, Any], state: str) -> None:
    """Write the job's logs once it has ended."""
    if job.get("logs_written"):
        return
    job["logs_written"] = True
    for key in ("stdout", "stderr"):
        path = job[key + "_path"]
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as fh:
                fh.write(job["spec_" + key])
    if state == "CANCELLED" and job["stderr_path"]:
        with open(job["stderr_path"], "a") as fh:
            fh.write(f"slurmstepd: error: *** JOB {job['id']} CANCELLED ***\n")


def opt(argv: list[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "=") and flag.startswith("--"):
            return arg.split("=", 1)[1]
    return None


def sbatch(argv: list[str], stdout: TextIO, stderr: TextIO) -> int:
    scen = scenario()
    if scen.get("refuse"):
        stderr.write(f"sbatch: error: Batch job submission failed: {scen['refuse']}\n")
        return 1
    script = Path(argv[-1])
    text = script.read_text()
    name = opt(argv, "--job-name") or "sbatch"
    directives = dict(m.groups() for m in re.finditer(r"^#SBATCH --(\w+)=\"?([^\"\n]*)\"?$",
                                                       text, re.M))
    spec = spec_for(name, scen)
    states = [list(s) for s in spec["states"]]
    index = name.rsplit("-", 1)[-1]
    if spec.get("spread") and index.isdigit() and len(states) > 2:
        states[1][1] += spec["spread"] * (int(index) % 7)
    array = opt(argv, "--array") or directives.get("array")
    if array and max(array_indices(array)[0]) >= scen.get("max_array_size", MAX_ARRAY_SIZE):
        stderr.write("sbatch: error: Batch job submission failed: Invalid job array "
                     "specification\n")
        return 1
    with Store() as data:
        job_id = str(data["next"])
        data["next"] += 1
        tasks: list[tuple[str, int | None]] = [(job_id, None)]
        if array:  # one job per task, "<id>_<index>", started in waves of the throttle
            indices, throttle = array_indices(array)
            tasks = [(f"{job_id}_{i}", i) for i in indices]
        busy = sum(ticks for _, ticks in states[:-1])
        for n, (key, index) in enumerate(tasks):
            mine = {**spec, **scen.get("task_specs", {}).get(key, {})}
            wave = n // throttle if array and throttle else 0
            task_states = ([["PENDING", wave * busy]] if wave else []) + [
                list(st) for st in mine.get("states", states)]
            out = log_path(directives.get("output", "slurm-%j.out"), job_id, index)
            err = log_path(directives.get("error", directives.get("output", "slurm-%j.out")),
                           job_id, index)
            data["jobs"][key] = {
                "id": key, "name": name, "submitted": data["tick"], "states": task_states,
                "exit": mine["exit"], "spec_stdout": mine["stdout"],
                "spec_stderr": mine["stderr"],
                "stdout_path": str(script.parent / out) if not out.startswith("/") else out,
                "stderr_path": str(script.parent / err) if not err.startswith("/") else err,
                "partition": directives.get("partition", "debug"),
                "dependency": opt(argv, "--dependency"), "argv": argv,
            }
    pid_dir = re.search(r"^export HPCDL_PID_DIR=(.*)$", text, re.M)
    if pid_dir and spec.get("pids"):  # what the rank wrapper writes when the ranks start
        folder = Path(shlex.split(pid_dir.group(1))[0])
        for name, line in spec["pids"].items():
            (folder / name).write_text(line + "\n")
    run_dir = re.search(r"^export HPCDL_RUN_DIR=(.*)$", text, re.M)
    if run_dir and spec.get("run_files"):  # what the job itself writes there (its watchdog)
        folder = Path(shlex.split(run_dir.group(1))[0])
        for name, content in spec["run_files"].items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(content)
    print(f"{job_id};fake" if "--parsable" in argv else f"Submitted batch job {job_id}", file=stdout)
    return 0


def array_indices(spec: str) -> tuple[list[int], int | None]:
    """sbatch --array's "0-5%2" / "3,5" as ([0..5], 2) / ([3, 5], None)."""
    body, _, throttle = spec.partition("%")
    indices: list[int] = []
    for part in body.split(","):
        low, _, high = part.partition("-")
        indices += list(range(int(low), int(high or low) + 1))
    return indices, int(throttle) if throttle else None


def log_path(pattern: str, job_id: str, index: int | None) -> str:
    """Slurm's filename pattern: %j, %A (the array's id), %a and %3a (the task index,
    zero-padded to 3)."""
    text = pattern.replace("%j", job_id)
    text = text.replace("%A", job_id)
    if index is not None:
        text = re.sub(r"%(\d*)a", lambda m: str(index).zfill(int(m.group(1) or 0)), text)
    return text


def expand_ids(ids: list[str], data: dict[str, Any]) -> list[str]:
    """An array's id stands for each of its tasks (squeue -j / sacct -j / scancel)."""
    out: list[str] = []
    for job_id in ids:
        if job_id in data["jobs"]:
            out.append(job_id)
        out += [k for k in data["jobs"] if k.startswith(job_id + "_") and "_" not in job_id]
    return out


def srun(argv: list[str], stdout: TextIO, stderr: TextIO) -> int:
    """Only ``srun --overlap --jobid=J --nodelist=N ...`` (the hang watchdog's step)."""
    job_id, node = opt(argv, "--jobid"), opt(argv, "--nodelist")
    with Store() as data:
        job = data["jobs"].get(job_id or "")
        state = where(job, data["tick"])[0] if job else None
    if job is None or state != "RUNNING":
        stderr.write(f"srun: error: Unable to create step for job {job_id}: "
                         "Job/step already completing or completed\n")
        return 1
    spec = spec_for(job["name"], scenario())
    stdout.write(spec.get("srun", {}).get(node, ""))
    return 0


def _rows(ids: list[str] | None, data: dict[str, Any]) -> list[tuple[dict[str, Any], str, Any]]:
    out = []
    for job_id in expand_ids(ids, data) if ids is not None else list(data["jobs"]):
        job = data["jobs"].get(job_id)
        if job is not None:
            state, ended = where(job, data["tick"])
            if ended is not None:
                finish(job, state)
            out.append((job, state, ended))
    return out


def squeue(argv: list[str], stdout: TextIO, stderr: TextIO) -> int:
    ids = opt(argv, "-j")
    age = scenario().get("min_job_age", 3)
    with Store() as data:
        if not data["external"]:
            data["tick"] += 1
        rows = [(j, s, e) for j, s, e in _rows(ids.split(",") if ids else None, data)
                if e is None or data["tick"] - e <= age]
    if ids and "," not in ids and not rows:
        stderr.write("slurm_load_jobs error: Invalid job id specified\n")
        return 1
    for job, state, ended in rows:
        nodes = "" if state == "PENDING" else "n1"
        reason = "Priority" if state == "PENDING" else "None"
        if "-O" in argv:  # hpcdl's batched query: exit_code is the raw wait status
            code, sig = exit_of(job, state) if ended is not None else (0, 0)
            base, _, task = job["id"].partition("_")
            print(f"{base}|{task or 'N/A'}|{state}|{reason}|{nodes}|0:01|30:00|{job['partition']}|"
                  f"{(code << 8) | sig}|{job['name']}", file=stdout)
        else:
            print(f"{job['id']}|{state}|{reason}|{nodes}|0:01|30:00|{job['partition']}|"
                  f"{job['name']}", file=stdout)
    return 0


def exit_of(job: dict[str, Any], state: str) -> tuple[int, int]:
    """(exit, signal) of an ended job: the scenario's, or signal 15 when cancelled."""
    if state == "CANCELLED":
        return 0, 15
    code, _, sig = job["exit"].partition(":")
    return int(code), int(sig or 0)


REQUEUE_STATES = ("PREEMPTED", "NODE_FAIL", "REQUEUED")


def earlier_attempts(job: dict[str, Any], tick: int) -> list[str]:
    """The states of the attempts of ``job`` that ended in a requeue before ``tick``."""
    age, out = tick - job["submitted"], []
    for state, ticks in job["states"][:-1]:
        if age < ticks:
            break
        age -= ticks
        if state in REQUEUE_STATES:
            out.append(state)
    return out


def sacct(argv: list[str], stdout: TextIO, stderr: TextIO) -> int:
    ids = opt(argv, "-j")
    lag = scenario().get("sacct_lag", 1)
    with Store() as data:
        rows = _rows(ids.split(",") if ids else None, data)
        tick = data["tick"]
    if "-D" in argv:  # every attempt: HISTORY_FIELDS, the name last
        for job, state, ended in rows:
            for n, old in enumerate(earlier_attempts(job, tick)):
                print(f"{job['id']}|{old}|0:0|n1|00:00:02|30:00|{job['partition']}|"
                      f"2026-01-01T00:0{n}:00|2026-01-01T00:0{n}:30|None|{job['name']}", file=stdout)
            code = "{}:{}".format(*exit_of(job, state)) if ended is not None else "0:0"
            print(f"{job['id']}|{state}|{code}|n1|00:00:03|30:00|{job['partition']}|"
                  f"2026-01-01T00:09:00|{'2026-01-01T00:09:30' if ended else 'Unknown'}|None|"
                  f"{job['name']}", file=stdout)
        return 0
    for job, state, ended in rows:
        if ended is not None and tick - ended < lag:
            print(f"{job['id']}|PENDING|0:0||00:00:00|30:00|{job['partition']}|allocation", file=stdout)
            continue
        code = "{}:{}".format(*exit_of(job, state)) if ended is not None else "0:0"
        print(f"{job['id']}|{state}|{code}|n1|00:00:03|30:00|{job['partition']}|{job['name']}", file=stdout)
    return 0


def scontrol(argv: list[str], stdout: TextIO, stderr: TextIO) -> int:
    if argv[-1] == "partition":
        stdout.write(PARTITIONS)
        return 0
    if argv[-2:] == ["show", "config"]:  # a few lines of it, spaced as Slurm spaces them
        size = scenario().get("max_array_size", MAX_ARRAY_SIZE)
        stdout.write("Configuration data as of 2026-11-26T10:00:00\n"
                     "ClusterName             = fake\n"
                     f"MaxArraySize            = {size}\n"
                     "MaxJobCount             = 10000\n"
                     "SLURM_VERSION           = 23.11.4\n")
        return 0
    job_id = argv[-1]
    with Store() as data:
        rows = _rows([job_id], data)
    if not rows:
        stderr.write("slurm_load_jobs error: Invalid job id specified\n")
        return 1
    job, state, ended = rows[0]
    code = job["exit"] if ended is not None else "0:0"
    print(f"JobId={job_id} JobName={job['name']} JobState={state} Reason=None "
          f"ExitCode={code} StdErr={job['stderr_path']} StdIn=/dev/null "
          f"StdOut={job['stdout_path']} Power=", file=stdout)
    return 0


def scancel(argv: list[str], stdout: TextIO, stderr: TextIO) -> int:
    with Store() as data:
        for job_id in argv:
            found = expand_ids([job_id], data)
            if not found:
                stderr.write(f"scancel: error: Invalid job id {job_id}\n")
            for key in found:
                job = data["jobs"][key]
                if where(job, data["tick"])[1] is None:
                    job["cancelled_at"] = data["tick"]
    return 0


def sinfo(argv: list[str], stdout: TextIO, stderr: TextIO) -> int:
    stdout.write(SINFO)
    return 0


TOOLS = {"sbatch": sbatch, "squeue": squeue, "sacct": sacct, "scontrol": scontrol,
         "scancel": scancel, "sinfo": sinfo, "srun": srun}


def call(tool: str, argv: list[str], stdout: TextIO, stderr: TextIO) -> int:
    """Run ``tool`` (a key of TOOLS) as its command would: its output goes to ``stdout``
    and ``stderr``, its exit status is returned. The PATH wrappers (bin/) and the in-process
    executor of tests/fakeslurm/fixture.py both come here."""
    with open(state_dir() / "calls.jsonl", "a") as fh:
        fh.write(json.dumps({"tool": tool, "argv": argv}) + "\n")
    return TOOLS[tool](argv, stdout, stderr)


def main() -> int:
    return call(sys.argv[1], sys.argv[2:], sys.stdout, sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
