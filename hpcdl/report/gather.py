"""What a run directory holds, gathered for the report: its identity (plan, job, image,
result), its attempts, the probe's report, the hang diagnosis, every rank's per-step
metrics and the straggler verdict, and, in plain sentences, what is missing and why.

Reads only (RunDir and hpcdl.jobside.steps own the files); never asks Slurm.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from hpcdl.jobs import recoveries
from hpcdl.jobs.rundir import RunDir
from hpcdl.jobside import steps as step_metrics
from hpcdl.results.straggler import DEFAULT_THRESHOLD, verdict


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def attempt_spans(metrics: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per attempt, from the lowest rank's metrics file: its number, first and last
    step, wall-clock start and end, and the steps it did again (those an earlier
    attempt had done past the checkpoint it resumed from)."""
    if not metrics:
        return []
    info = metrics[min(metrics)]
    spans: dict[int, dict[str, Any]] = {}
    for start in info.get("starts", []):
        number = start.get("attempt") if isinstance(start.get("attempt"), int) else 0
        spans.setdefault(number, {"attempt": number, "start_t": start.get("t"),
                                  "job_id": start.get("job_id")})
    for rec in info.get("all_steps", info.get("steps", [])):
        number = rec.get("attempt") if isinstance(rec.get("attempt"), int) else 0
        span = spans.setdefault(number, {"attempt": number, "start_t": rec.get("t"),
                                         "job_id": None})
        span["first_step"] = min(span.get("first_step", rec["step"]), rec["step"])
        span["last_step"] = max(span.get("last_step", rec["step"]), rec["step"])
        span["end_t"] = max(span.get("end_t") or 0, rec.get("t") or 0)
        span["steps"] = span.get("steps", 0) + 1
    out = sorted(spans.values(), key=lambda s: s["attempt"])
    done = 0
    for span in out:
        first = span.get("first_step")
        span["redone"] = max(0, done - first + 1) if first is not None else 0
        done = max(done, span.get("last_step") or 0)
    return out


def gather_run(path: Path, *, threshold: float = DEFAULT_THRESHOLD) -> dict[str, Any]:
    """Everything the run report shows, from run directory ``path``; ``missing`` lists
    what is not there, each with what it means."""
    run = RunDir(path)
    missing: list[str] = []
    plan = _json(run.plan_file)
    if not isinstance(plan, dict):
        plan = {}
        missing.append("plan.json: not a run directory written by `hpcdl submit`, or an "
                       "unreadable one (no command, profile or shape to show)")
    job = run.read_job()
    if job is None:
        missing.append("job.json: the job was never submitted (no Slurm job id)")
    result = _json(run.result_file)
    if not isinstance(result, dict):
        result = {}
        missing.append("result.json: the job has not been followed to its end yet "
                       f"(`hpcdl results {path}` writes it once the job ended)")
    image = _json(run.image_file) if run.image_file.is_file() else None
    attempts = _json(run.attempts_file)
    attempts = attempts.get("attempts") if isinstance(attempts, dict) else None
    hang = _json(run.hang_json) if run.hang_json.is_file() else None
    metrics = step_metrics.read_metrics(run.metrics)
    if not metrics:
        missing.append("metrics/: no per-step metrics (a run from before hpcdl wrote them, "
                       "or a command that writes none: hpcdl.jobside.steps.StepWriter "
                       "writes them from any Python script). No loss, throughput, per-rank "
                       "or straggler charts")
    elif (expected := plan.get("ntasks")) and len(metrics) < expected:
        absent = sorted(set(range(int(expected))) - set(metrics))
        missing.append(f"metrics/: {len(metrics)} of {expected} ranks wrote per-step "
                       f"metrics; none from rank{'s' if len(absent) > 1 else ''} "
                       f"{', '.join(map(str, absent[:16]))}")
    skipped = sum(m.get("skipped", 0) for m in metrics.values())
    if skipped:
        missing.append(f"metrics/: {skipped} line(s) could not be read (a rank killed "
                       "mid-write) and were left out")
    command = plan.get("command")
    return {
        "kind": "run",
        "path": str(path.resolve()),
        "name": path.resolve().name,
        "plan": plan,
        "command": shlex.join(str(c) for c in command) if isinstance(command, list) else None,
        "job": job.to_dict() if job is not None else None,
        "result": result,
        "image": image if isinstance(image, dict) else None,
        "attempts": attempts if isinstance(attempts, list) else [],
        "spans": attempt_spans(metrics),
        # The node failures a job with spares met inside its allocation (--spares).
        "recoveries": [r.to_dict() for r in recoveries.read(path)],
        "excluded_nodes": recoveries.excluded(path),
        "probe": result.get("probe") if isinstance(result.get("probe"), dict) else None,
        "hang": hang if isinstance(hang, dict) else None,
        "metrics": metrics,
        "straggler": verdict(metrics, threshold=threshold) if metrics else None,
        "missing": missing,
    }


