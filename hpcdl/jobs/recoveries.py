"""The node guard's record of a run (hpcdl submit --spares; hpcdl.launch.nodes): one line
per node failure in ``RUN_DIR/recoveries.tsv``, written by job/bin/hpcdl-nodes, read here
and joined with the per-step metrics into what ``status``, ``submit --wait`` and the
report show: which node, what was detected and how, the checkpoint the training went
back to, the steps lost, the seconds from detection to the first training step after
the relaunch.

    JOB  ATTEMPT  RELAUNCH  DETECTED_AT  NODES  HOW  RELAUNCHED_AT  ACTIVE  CHECKPOINT

(tab-separated; times are Unix seconds; RELAUNCHED_AT and ACTIVE are "-" when the
training was not started again: too few healthy nodes, no relaunch left, no time left).

Every node the guard excluded, before the first rank (the health gate, the --probe-first
step) or after a failure, is one line of ``RUN_DIR/bad-nodes.tsv``: ``NODE  WHY``;
``excluded`` reads it.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from hpcdl.jobside.steps import metrics_dir, read_metrics
from hpcdl.launch.nodes import BAD_NODES_NAME, RECOVERIES_NAME

_CHECKPOINT_STEP = re.compile(r"checkpoint-0*(\d+)\.pt")


@dataclass(frozen=True)
class Recovery:
    """One node failure the job survived (or did not: ``relaunched_at`` None)."""

    job_id: str
    attempt: int
    relaunch: int
    detected_at: float
    nodes: tuple[str, ...]
    how: str
    relaunched_at: float | None
    active: tuple[str, ...]
    checkpoint: str | None
    # From the metrics (rank 0): the last step before the failure was detected, the
    # first one after the relaunch and when it ended.
    failed_step: int | None = None
    first_step_at: float | None = None

    @property
    def checkpoint_step(self) -> int | None:
        m = _CHECKPOINT_STEP.fullmatch(self.checkpoint or "")
        return int(m.group(1)) if m else None

    @property
    def steps_lost(self) -> int | None:
        """Steps done before the failure that the relaunch did again (those since the
        checkpoint it resumed from)."""
        if self.failed_step is None:
            return None
        return max(0, self.failed_step - (self.checkpoint_step or 0))

    @property
    def seconds_to_train(self) -> float | None:
        """From the failure's detection to the end of the first training step after the
        relaunch (None: not relaunched, or no step recorded since)."""
        if self.first_step_at is None or self.relaunched_at is None:
            return None
        return round(self.first_step_at - self.detected_at, 1)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["nodes"], data["active"] = list(self.nodes), list(self.active)
        data.update(steps_lost=self.steps_lost, seconds_to_train=self.seconds_to_train)
        return data


def _nodes(text: str) -> tuple[str, ...]:
    return tuple(n for n in text.split(",") if n and n != "-")


def parse(text: str) -> list[Recovery]:
    """recoveries.tsv's lines (malformed ones left out)."""
    out = []
    for line in text.splitlines():
        cols = line.split("\t")
        if len(cols) != 9:
            continue
        job, attempt, relaunch, detected, nodes, how, relaunched, active, ckpt = cols
        try:
            out.append(Recovery(
                job_id=job, attempt=int(attempt), relaunch=int(relaunch),
                detected_at=float(detected), nodes=_nodes(nodes), how=how,
                relaunched_at=None if relaunched == "-" else float(relaunched),
                active=_nodes(active), checkpoint=None if ckpt == "-" else ckpt))
        except ValueError:
            continue
    return out


def read(run_dir: Path, job_id: str | None = None) -> list[Recovery]:
    """The run's recoveries (of ``job_id``, when given), with the steps from its metrics;
    empty when the job had none (or no spares)."""
    try:
        text = (run_dir / RECOVERIES_NAME).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    found = [r for r in parse(text) if job_id is None or r.job_id == job_id]
    if not found:
        return []
    ranks = read_metrics(metrics_dir(run_dir))
    steps = ranks[min(ranks)]["all_steps"] if ranks else []
    return [with_steps(r, steps) for r in found]


def excluded(run_dir: Path) -> list[dict[str, str]]:
    """Every node the run's guard excluded and why (``{"node", "why"}``, in the order
    they were found), across attempts; empty without spares."""
    try:
        text = (run_dir / BAD_NODES_NAME).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return [{"node": node, "why": why} for node, _, why in
            (line.partition("\t") for line in text.splitlines()) if node and why]


def excluded_line(nodes: list[dict[str, str]]) -> str:
    """One line for a terminal: ``nodes excluded: N1 (why); N2 (why)``."""
    return "nodes excluded: " + "; ".join(f"{n['node']} ({n['why']})" for n in nodes)


def with_steps(rec: Recovery, steps: list[dict[str, Any]]) -> Recovery:
    """``rec`` with the step it failed after and the first step after its relaunch, from
    one rank's step records (hpcdl.jobside.steps: "step" and its end time "t")."""
    timed = [(float(s["t"]), int(s["step"])) for s in steps
             if isinstance(s.get("t"), (int, float))]
    before = [step for t, step in timed if t <= rec.detected_at]
    after = [t for t, _ in timed if rec.relaunched_at is not None and t > rec.relaunched_at]
    return replace(rec, failed_step=max(before) if before else None,
                   first_step_at=min(after) if after else None)


def lines(recoveries: list[Recovery]) -> list[str]:
    """A table for a terminal: one row per node failure."""
    out = [f"{'RELAUNCH':<9} {'NODE':<12} {'DETECTED':<9} {'STEPS LOST':<11} "
           f"{'BACK IN':<8} HOW"]
    for r in recoveries:
        back = "-" if r.seconds_to_train is None else f"{r.seconds_to_train:g} s"
        lost = "-" if r.steps_lost is None else str(r.steps_lost)
        where = ("not relaunched" if r.relaunched_at is None
                 else f"-> {','.join(r.active)} from {r.checkpoint or 'the start'}")
        detected = time.strftime("%H:%M:%S", time.localtime(r.detected_at))
        out.append(f"{r.relaunch:<9} {','.join(r.nodes) or '?':<12} "
                   f"{detected:<9} {lost:<11} {back:<8} {r.how} {where}")
    return out
