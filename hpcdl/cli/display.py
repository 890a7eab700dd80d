"""What the job commands print: the live status line while a job is followed, how it
ended, a probe's tables, and a sweep's progress bar. The job flows (hpcdl.jobs) report
through callbacks while they run and return outcome values; this is the one place that
turns them into terminal output.

rich is imported only where a table or a live bar is drawn: it would add tens of
milliseconds to the start of every job command, for output most runs never show.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from hpcdl.hang.diagnosis import Diagnosis
from hpcdl.jobs.attempts import Attempt, no_step_message
from hpcdl.jobs.follow import RETRY_S
from hpcdl.jobs.logs import describe_failures, format_result_table
from hpcdl.jobs.recoveries import Recovery, excluded_line
from hpcdl.jobs.recoveries import lines as recovery_lines
from hpcdl.jobs.result import JobLogs, ResultRecord
from hpcdl.jobs.rundir import RunDir
from hpcdl.jobs.timelimit import timeout_message
from hpcdl.jobside.protocol import format_size, without_probe
from hpcdl.launch.nodes import RECOVERIES_NAME
from hpcdl.results.table import Row
from hpcdl.schedulers.base import JobState, JobStatus, Scheduler
from hpcdl.schedulers.executor import ConnectionLost
from hpcdl.schedulers.registry import scheduler_for


def echo(message: str = "", err: bool = False, nl: bool = True) -> None:
    click.echo(message, err=err, nl=nl)


class StatusLine:
    """``job 42: RUNNING on n1 [3 s]`` on stderr: rewritten in place on a terminal,
    a new line only when the state changes otherwise. ``quiet`` prints nothing."""

    def __init__(self, job_id: str, *, live: bool | None = None, quiet: bool = False) -> None:
        self.job_id = job_id
        self.live = sys.stderr.isatty() if live is None else live
        self.quiet = quiet
        self.last = ""

    def __call__(self, pending: dict[str, JobStatus], elapsed: float) -> None:
        status = pending.get(self.job_id)
        if status is None or self.quiet:
            return
        line = (f"job {self.job_id}: {status.state}"
                f"{' (' + status.reason + ')' if status.reason else ''}"
                f"{' on ' + status.nodes if status.nodes else ''} [{elapsed:.0f} s]")
        if self.live:
            echo("\r\033[K" + line, err=True, nl=False)
        elif line.split(" [")[0] != self.last.split(" [")[0]:
            echo(line, err=True)
        self.last = line

    def close(self) -> None:
        if self.live and self.last and not self.quiet:
            echo("", err=True)


def lost_line(line: StatusLine | None = None) -> Callable[[ConnectionLost, float], None]:
    """What the user sees while the login node is out of reach: one line when it goes
    (then one a minute), saying the job goes on and hpcdl tries again."""
    shown = {"at": -60.0}

    def lost(err: ConnectionLost, away: float) -> None:
        if away and away - shown["at"] < 60:
            return
        shown["at"] = away
        if line is not None:
            line.close()
        echo(f"warning: {err.message} [{away:.0f} s]; the job goes on on the cluster, "
             f"trying again every {RETRY_S:g} s", err=True)

    return lost


def size_text(size: int) -> str:
    """A byte count as people read it: 512 B, 38.2 kB, 1.4 MB, 2.1 GB."""
    value = float(size)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{size} B"


def attempt_lines(attempts: list[Attempt]) -> list[str]:
    """A table of a requeued job's attempts: number, job, reason, start, end, exit."""
    lines = [f"{'ATTEMPT':<8} {'JOBID':<10} {'REASON':<10} {'SLURM':<10} {'START':<20} "
             f"{'END':<20} EXIT"]
    for a in attempts:
        code = "" if a.exit_code is None else str(a.exit_code)
        lines.append(f"{a.number:<8} {a.job_id:<10} {a.reason:<10} {a.native_state:<10} "
                     f"{a.start:<20} {a.end:<20} {code}")
    return lines


def print_job_end(status: JobStatus, run_dir: Path, logs: JobLogs, record: ResultRecord,
           tail_lines: int = 20, max_time: str | None = None,
           attempts: list[Attempt] | None = None, hang: Diagnosis | None = None,
           html: Path | None = None, straggler: dict[str, Any] | None = None,
           steps: bool | None = None, nodes: int = 1,
           recoveries: list[Recovery] | None = None,
           excluded: list[dict[str, str]] | None = None,
           scheduler: Scheduler | None = None) -> None:
    """What a user reads once the job ended: state and exit code, the log's tail, which
    rank crashed and its last lines (on failure), the result table (on success), and
    for a job that ran out of time the limit it hit and the fix (``max_time``: the
    partition's limit, for how much more --time is possible; ``steps`` False: it
    completed no training step, so it looks hung), a requeued job's last attempt that
    failed before its first step, what the hang watchdog found (``hang``), the
    straggler verdict when it names one, and where the HTML report is (``html``).
    ``scheduler``: the job's (default: scheduler_for()'s), which words its state and
    its notes in the stderr.
    """
    scheduler = scheduler or scheduler_for()
    probe = record.get("probe")
    # A probe that named a slow node ended the job on purpose (rank 0, exit 1): its
    # verdict below says why; that is not a crash to trace.
    stopped_by_probe = bool(probe and probe.get("verdict", {}).get("bad"))
    # A job the hang watchdog cancelled did not crash either: its diagnosis says why.
    stopped = hang is not None and hang.cancelled
    # At a time limit Slurm terminates every rank: srun's "Terminated" lines are not a
    # crash to trace (the stderr tail and the timeout line below say what happened).
    crashed = ([] if status.state in (JobState.COMPLETED, JobState.TIMEOUT) or stopped_by_probe or stopped
               else describe_failures(logs.out, logs.err))
    lines = [status_line(status, scheduler),
             *log_tail_lines(status, logs, tail_lines, crashed=crashed, probe=bool(probe)),
             *crash_lines(status, logs, crashed),
             *outcome_lines(status, RunDir(run_dir), record, stopped_by_probe)]
    timed_out = timeout_message(status, logs.err, scheduler=scheduler, max_time=max_time,
                                steps=steps, nodes=nodes)
    no_step = no_step_message(attempts or [], logs.err, scheduler=scheduler, nodes=nodes)
    lines += [text for text in (timed_out, no_step) if text]
    lines += history_lines(RunDir(run_dir), hang, attempts or [], recoveries or [], excluded)
    # Named stragglers, and why none is named where the ranks outnumber the cores (a
    # newcomer's 8 ranks on a 2-core machine would otherwise read as a slow node).
    if straggler and (straggler.get("found") or straggler.get("oversubscribed")):
        lines.append(str(straggler["message"]))
    if html is not None:
        lines.append(f"report: {html}")
    lines.append(f"run directory: {run_dir}")
    for line in lines:
        echo(line)


def status_line(status: JobStatus, scheduler: Scheduler) -> str:
    """The job's end in one line: state (the scheduler's word too), exit code, signal,
    elapsed time. Pure."""
    return (f"job {status.job_id}: {status.state} ({scheduler.label} {status.native_state}), "
            f"exit code {status.exit_code if status.exit_code is not None else '?'}"
            f"{', signal ' + str(status.signal) if status.signal else ''}, elapsed {status.elapsed}")


def log_tail_lines(status: JobStatus, logs: JobLogs, tail_lines: int, *,
                   crashed: list[str], probe: bool) -> list[str]:
    """The last ``tail_lines`` lines of stdout, and of stderr when the job did not
    complete and no crash was traced (the trace shows the stderr that matters). Pure."""
    # The probe's report is shown as tables below, not as its (long) JSON line.
    out_text = without_probe(logs.out) if probe else logs.out
    out: list[str] = []
    for label, path, text in (("stdout", logs.out_path, out_text),
                              ("stderr", logs.err_path, logs.err)):
        lines = text.splitlines()[-tail_lines:]
        if lines and (label == "stdout" or (status.state != JobState.COMPLETED and not crashed)):
            out += [f"--- last {len(lines)} lines of {label} ({path}) ---", *lines]
    return out


def crash_lines(status: JobStatus, logs: JobLogs, crashed: list[str]) -> list[str]:
    """Which rank failed and its last lines (``describe_failures``), and where the whole
    logs are; empty when nothing crashed. Pure."""
    if not crashed:
        return []
    return [f"--- the job failed: {crashed[0]} ---", *crashed[1:],
            f"full logs: hpcdl logs {status.job_id} (or {logs.err_path})"]


def outcome_lines(status: JobStatus, run: RunDir, record: ResultRecord,
                  stopped_by_probe: bool) -> list[str]:
    """The training's result table and the probe's tables, where the job wrote them. Pure."""
    out: list[str] = []
    result = record.get("hpcdl_result")
    if result:
        out += [f"--- result ({run.result_file}) ---",
                format_result_table(result, record.get("ranks"))]
    probe = record.get("probe")
    if probe:
        out += [f"--- probe ({run.result_file}: probe) ---", probe_view(probe)]
        if stopped_by_probe:
            out.append(f"--- the probe found a slow node or link: the job stopped (exit "
                       f"{status.exit_code}) ---")
    return out


def history_lines(run: RunDir, hang: Diagnosis | None, attempts: list[Attempt],
                  recoveries: list[Recovery], excluded: list[dict[str, str]] | None
                  ) -> list[str]:
    """What happened on the way: the hang watchdog's gist, the attempts of a requeued
    job, node failures recovered inside the job, and the nodes left out. Pure."""
    out: list[str] = []
    if hang is not None:  # its lines were shown when it fired (hang_lines): the gist
        out += [f"--- {'stopped' if hang.cancelled else 'diagnosed'} by the hang watchdog "
                f"({run.hang_text}) ---", hang.summary]
    if attempts:
        out.append(f"--- {len(attempts)} attempt{'s' if len(attempts) != 1 else ''} "
                   f"({run.attempts_file}) ---")
        out += attempt_lines(attempts)
    if recoveries:
        out.append(f"--- {len(recoveries)} node failure{'s' if len(recoveries) != 1 else ''} "
                   f"inside the job ({run.path / RECOVERIES_NAME}) ---")
        out += recovery_lines(recoveries)
    if excluded:
        out.append(excluded_line(excluded))
    return out


def _seconds(value: float) -> str:
    """A time in the unit that reads best, 3 digits: 35.2 us, 1.43 ms, 144 ms, 2.10 s."""
    for unit, factor in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if value >= factor or unit == "us":
            scaled = value / factor
            digits = 0 if scaled >= 100 else 1 if scaled >= 10 else 2
            return f"{scaled:.{digits}f} {unit}"
    raise AssertionError("unreachable")


def _gbs(value: float | None) -> str:
    return "" if value is None else f"{value:.3g}"


def _share(value: float | None, of: float | None) -> str:
    return "" if value is None or not of else f"{value / of:.0%}"


def probe_view(report: dict[str, Any], *, width: int = 110) -> str:
    """The probe's report as text: the allreduce table (torch.distributed and MPI rows),
    the node-pair table, the transport facts and the verdict. A report that holds an
    error renders as that one line. Pure (rich renders into a string)."""
    # Lazy: rich only when the tables are drawn (see the module's docstring).
    from rich import box
    from rich.console import Console
    from rich.table import Table

    if "error" in report:
        return f"probe error on node {report.get('node', '?')}: {report['error']}"
    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=False, color_system=None,
                      highlight=False)
    expected = report.get("expected_gbs")
    nodes = report.get("nodes", [])
    table = Table(title=(f"allreduce over {len(nodes)} nodes x {report.get('ranks_per_node')} "
                         f"ranks = {report.get('world_size')} ranks; median of "
                         f"{report.get('iters')} timed calls (slowest rank each)"),
                  title_justify="left", box=box.SIMPLE_HEAD)
    for name, justify in (("size", "right"), ("algorithm/backend", "left"), ("ranks", "right"),
                          ("time", "right"), ("algbw GB/s", "right"), ("busbw GB/s", "right"),
                          ("vs expected", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    mpi = report.get("mpi") or {}
    for row in [*report.get("allreduce", []), *mpi.get("allreduce", [])]:
        table.add_row(format_size(row["size"]), row["algorithm"], str(row["ranks"]),
                      _seconds(row["time_s"]), _gbs(row["algbw_gbs"]), _gbs(row["busbw_gbs"]),
                      _share(row["busbw_gbs"], expected))
    console.print(table)
    lines = []
    if expected:
        lines.append(f"expected (profile interconnect.expected_busbw_gbs): {expected:g} GB/s bus "
                     "bandwidth between nodes")
    if mpi.get("skipped"):
        lines.append(f"MPI: not measured ({mpi['skipped']})")
    elif mpi.get("library"):
        lines.append(f"MPI: {mpi['library']}")
    judged = report.get("verdict", {})
    reference = judged.get("reference_gbs")
    pairs = Table(title=(f"node pairs: allreduce of {format_size(report.get('pair_size', 0))} "
                         f"between the first ranks of two nodes ({report.get('pair_mode')})"),
                  title_justify="left", box=box.SIMPLE_HEAD)
    for name in ("pair", "time", "algbw GB/s", "busbw GB/s",
                 "vs " + ("median node" if judged.get("reference") == "median node"
                          else "expected"), "slow"):
        pairs.add_column(name, justify="left" if name == "pair" else "right")
    slow_links = {tuple(link) for link in judged.get("slow_links", [])}
    for row in report.get("pairs", []):
        pairs.add_row("-".join(row["nodes"]), _seconds(row["time_s"]), _gbs(row["algbw_gbs"]),
                      _gbs(row["busbw_gbs"]), _share(row["busbw_gbs"], reference),
                      "yes" if tuple(row["nodes"]) in slow_links else "")
    console.print(pairs)
    transport = report.get("transport", {})
    facts = [f"transport: {transport.get('backend')}"
             + (f" over {transport['transport']}" if transport.get("transport") else "")
             + (f" on {transport['devices']}" if transport.get("devices") else "")
             + f" (torch {transport.get('torch')}"
             + (f", NCCL {transport['nccl']}" if transport.get("nccl") else "") + ")"]
    for node in transport.get("nodes", []):
        env = " ".join(f"{k}={v}" for k, v in sorted(node.get("env", {}).items()))
        facts.append(f"  {node['node']}: interface {node.get('interface') or '?'} "
                     f"({node.get('address') or 'no address'}) toward MASTER_ADDR"
                     f"{'; ' + env if env else '; NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME unset'}")
    verdict_line = f"verdict: {judged.get('message', 'none')}"
    tables = [line.rstrip() for line in out.getvalue().splitlines()]
    return "\n".join([*tables, *lines, *facts, verdict_line])


def hang_lines(diagnosis: Diagnosis, run: RunDir) -> list[str]:
    """What the hang watchdog found, in a few lines: the diagnosis, where the ranks are,
    where the dumps went and what was done to the job."""
    lines = [f"hang: {line}" for line in diagnosis.lines()]
    done = ("cancelled" if diagnosis.cancelled else
            "could not be cancelled" if diagnosis.action == "cancel" else
            ("asked to relaunch the training from its checkpoint"
             + (f" without {diagnosis.relaunch_without}" if diagnosis.relaunch_without else ""))
            if diagnosis.relaunched else
            "could not be asked to relaunch" if diagnosis.action == "relaunch" else
            "left running")
    lines.append(f"hang: stacks and diagnosis in {run.hang_dir} (collected in "
                 f"{diagnosis.collect_s:.1f} s); job {diagnosis.job_id} {done} "
                 f"(--hang-action {diagnosis.action})")
    return lines


def sweep_dir_line(here: Path, cluster: str | None) -> str:
    """A sweep dry run's line naming its sweep directory (the cluster's too, when it is
    copied there); the dry run creates it nowhere."""
    if cluster is not None:
        return f"# sweep directory on the cluster {cluster}, here {here} (nothing is created)"
    return f"# sweep directory {here} (nothing is created)"


def done_line(row: Row, elapsed: float) -> str:
    """One finished sweep point: its throughput, or its state and why."""
    what = (f"{row.images_per_sec:.1f} img/s" if row.ok and row.images_per_sec is not None
            else f"{row.state}{' (' + row.note + ')' if row.note else ''}")
    return f"{row.label}: {what} [{elapsed:.0f} s]"


class SweepBar:
    """A rich progress bar on a terminal; plain ``[k/n] line`` lines in logs and pipes."""

    def __init__(self, total: int, live: bool | None = None) -> None:
        self.done, self.total = 0, total
        self.progress: Any = None
        if sys.stderr.isatty() if live is None else live:
            # Lazy: rich only on a terminal (see the module's docstring).
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                     MofNCompleteColumn(), TimeElapsedColumn(),
                                     console=Console(stderr=True))
            self.task = self.progress.add_task("sweep", total=total)
            self.progress.start()

    def finished(self, line: str) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress.console.print(line, markup=False, highlight=False)
            self.progress.update(self.task, completed=self.done)
        else:
            echo(f"[{self.done}/{self.total}] {line}", err=True)

    def status(self, label: str, state: str) -> None:
        if self.progress is not None:
            self.progress.update(self.task, description=f"{label}: {state}")

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
