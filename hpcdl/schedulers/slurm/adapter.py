"""SlurmScheduler: hpcdl.schedulers.base.Scheduler for Slurm, built from the adapter's
parts (commands, query, livecheck, states). Talks to Slurm only, through the Executor
it is given; never prints."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hpcdl.errors import ToolError, ValidationError
from hpcdl.schedulers.base import Demand, JobStatus, RunFiles, SubmitOptions, TimeRanOut
from hpcdl.schedulers.executor import LOCAL, CommandDir, Executor
from hpcdl.schedulers.slurm import commands, livecheck, parse, query, releases, states
from hpcdl.schedulers.slurm.script import RUN_FILES

if TYPE_CHECKING:
    from hpcdl.core.proc import Result
    from hpcdl.profiles.schema import Profile


class SlurmScheduler:
    """Slurm through its command-line tools, run by ``executor`` (default: here).

    ``profile_name`` only words the hint when slurmctld cannot be reached.
    """

    name = "slurm"
    label = "Slurm"
    run_files: RunFiles = RUN_FILES
    stderr_noise: tuple[str, ...] = parse.STDERR_NOISE

    def __init__(self, profile_name: str | None = None, executor: Executor = LOCAL,
                 commands_dir: str | None = None) -> None:
        self.profile_name = profile_name
        # The profile's scheduler.commands: every Slurm command from that directory.
        self.executor: Executor = (CommandDir(executor, commands_dir, commands.SLURM_COMMANDS)
                                   if commands_dir else executor)
        self._found = False  # Slurm's tools were found once: over SSH each look is a trip
        self._config: dict[str, str] | None = None  # scontrol show config, read once
        self._release: releases.Release | None = None  # sbatch --version, read once

    def release(self) -> releases.Release:
        """The cluster's Slurm release and how it behaves (hpcdl.schedulers.slurm.releases),
        from ``sbatch --version``, read once per scheduler (one connection). Raises
        ToolError when sbatch cannot be run, ValidationError when it names no version."""
        if self._release is None:
            res = self.executor.run(commands.VERSION_ARGV, timeout=commands.COMMAND_TIMEOUT)
            self._release = releases.release_of(res.stdout or res.stderr,
                                                " ".join(commands.VERSION_ARGV))
        return self._release

    def available(self) -> bool:
        self._found = self._found or query.slurm_available(self.executor)
        return self._found

    def require(self) -> None:
        if not self.available():
            raise commands.not_on_path(self.executor)

    def check(self, profile: Profile, demands: Mapping[str, Demand]) -> list[str]:
        """The live check of every job's demand against one read of the cluster;
        returns the warnings. Raises ValidationError (prefixed with the job's label when
        there are several) or ToolError (slurmctld unreachable)."""
        try:
            cluster = livecheck.read_cluster(ex=self.executor)
        except ToolError as err:
            raise commands.unreachable(err, self.profile_name) from err
        warnings: list[str] = []
        for label, demand in demands.items():
            try:
                warnings += livecheck.check_demand(profile, demand, cluster)
            except ValidationError as err:
                if len(demands) > 1:
                    raise ValidationError(f"{label}: {err.message}", hint=err.hint) from err
                raise
        return warnings

    def max_array_size(self) -> int | None:
        """MaxArraySize from ``scontrol show config`` (read once per scheduler, like
        ``available``). Raises ToolError (slurmctld unreachable)."""
        if self._config is None:
            try:
                self._config = livecheck.read_config(ex=self.executor)
            except ToolError as err:
                raise commands.unreachable(err, self.profile_name) from err
        return livecheck.max_array_size(self._config)

    def submit_argv(self, script: str | Path, job_name: str,
                    options: SubmitOptions | None = None) -> list[str]:
        return commands.sbatch_argv(script, job_name, options)

    def submit(self, argv: list[str]) -> str:
        try:
            return commands.sbatch(argv, self.executor)
        except ToolError as err:
            raise commands.unreachable(err, self.profile_name) from err

    def statuses(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        return query.statuses(job_ids, self.executor)

    def status(self, job_id: str, *, settle_s: float = 0.0) -> JobStatus:
        return query.job_status(job_id, settle_s=settle_s, ex=self.executor)

    def may_come_back(self, status: JobStatus) -> bool:
        return states.may_come_back(status.native_state)

    def cancel(self, job_ids: Sequence[str]) -> None:
        commands.scancel(job_ids, ex=self.executor)

    def log_paths(self, job_id: str) -> tuple[Path, Path] | None:
        return commands.scontrol_log_paths(job_id, self.executor)

    def list_jobs(self, *, since: str, all_users: bool) -> list[JobStatus]:
        return query.list_jobs(since=since, all_users=all_users, ex=self.executor)

    def history(self, job_id: str) -> list[JobStatus]:
        return query.history(job_id, self.executor)

    def attempt_reason(self, native_state: str, *, last: bool,
                       script_cause: str | None) -> str:
        return states.attempt_reason(native_state, last=last, script_cause=script_cause)

    def time_ran_out(self, status: JobStatus, stderr: str = "") -> TimeRanOut | None:
        return parse.time_ran_out(status, stderr)

    def run_in_job(self, job_id: str, node: str, argv: Sequence[str], *,
                   timeout: float) -> Result:
        return commands.run_in_job(job_id, node, argv, timeout=timeout, ex=self.executor)
