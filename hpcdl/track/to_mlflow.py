"""MLflow: one MLflow run per hpcdl run, found again by its tag ``hpcdl.run_id`` (the run
directory's name), through MLflow's own client, to a tracking server (http/https URI)
or a local store (file:, sqlite: URI).

Idempotent: the parameters are logged once (a parameter cannot change in MLflow), a
metric point only when the run has no point of that key at that step yet (its history
is read back first), the result's figures once; the report is uploaded when something
new was logged or when it is not there. The MLflow run ends (FINISHED, FAILED or KILLED)
with the job.

A server is asked for /health first (plain HTTP, 10 s): an unreachable one is one line,
before anything is created.
"""

from __future__ import annotations

import contextlib
import io
import re
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from hpcdl.errors import ToolError, UserInputError
from hpcdl.track.source import RunSource

EXTRA_HINT = "pip install 'hpcdl[mlflow]'"
DEFAULT_EXPERIMENT = "hpcdl"
RUN_TAG = "hpcdl.run_id"
RESULT_PREFIX = "result."
REPORT_ARTIFACT = "report.html"
HEALTH_TIMEOUT_S = 10.0
# MLflow's batch limits: 1,000 metrics, 100 params, 100 tags per call.
METRICS_PER_CALL = 1000
PARAMS_PER_CALL = 100
# The job's end state (hpcdl.schedulers.base) -> the MLflow run's end status.
END_STATUS = {"COMPLETED": "FINISHED", "CANCELLED": "KILLED"}


def require() -> Any:
    """The mlflow package. Raises UserInputError naming the extra."""
    try:
        import mlflow
    except ImportError:
        raise UserInputError(f"--mlflow needs the mlflow package, which is not installed: "
                             f"{EXTRA_HINT}") from None
    return mlflow


def check_reachable(uri: str, timeout: float = HEALTH_TIMEOUT_S) -> None:
    """For an http(s) URI, that a server answers there at all (any HTTP answer will do: a
    proxy may want a login for /health). Raises ToolError when nothing answers."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout):
            pass
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ToolError(f"mlflow tracking server {uri}: not reachable ({reason}); nothing "
                        f"was logged", hint="start it (mlflow server ...) or check the URI; "
                        "a local store needs no server: --mlflow sqlite:///PATH/mlflow.db"
                        ) from None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] + ("..." if len(text) > 300 else "")


def local_artifact_root(uri: str) -> str | None:
    """Where a new experiment of a ``sqlite:`` store keeps its artifacts: beside the
    database (DIR/mlruns), not MLflow's default ./mlruns in whatever directory `hpcdl
    track` ran from. None (the store's own default) for a server or a file: store."""
    found = re.fullmatch(r"sqlite:///(/?[^?#]+)", uri)
    if found is None:
        return None
    return Path(found.group(1)).resolve().parent.joinpath("mlruns").as_uri()


class MlflowSink:
    """Logs runs to ``uri`` in experiment ``experiment`` (made when missing)."""

    def __init__(self, uri: str, experiment: str = DEFAULT_EXPERIMENT, *,
                 dry_run: bool = False) -> None:
        self.uri = uri
        self.experiment = experiment
        self._mlflow = require()
        self.dry_run = dry_run
        if not dry_run:
            check_reachable(uri)
        self._client: Any = None
        self._experiment_id: str | None = None
        self._runs: dict[str, str] = {}  # hpcdl run id -> MLflow run id
        self._logged: dict[str, dict[str, set[int]]] = {}  # MLflow run id -> key -> steps
        self._params: dict[str, set[str]] = {}
        self._tags: dict[str, dict[str, str]] = {}

    def _call(self, what: str, fn: Any, *args: Any, **kw: Any) -> Any:
        """One client call; any failure is a one-line ToolError naming the URI. MLflow's
        client writes "View run ... at: URL" to stdout when a run ends: that would break
        the caller's own output (--json), and this library never prints."""
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                return fn(*args, **kw)
        except Exception as exc:  # MlflowException, requests' errors, sqlalchemy's...
            raise ToolError(f"mlflow {self.uri}: {what} failed: {_one_line(exc)}") from exc

    @property
    def client(self) -> Any:
        if self._client is None:
            from mlflow.tracking import MlflowClient

            self._client = self._call("connecting", MlflowClient, tracking_uri=self.uri)
        return self._client

    def experiment_id(self) -> str:
        if self._experiment_id is None:
            found = self._call("reading the experiment", self.client.get_experiment_by_name,
                               self.experiment)
            if found is not None and found.lifecycle_stage != "active":
                raise UserInputError(f"--experiment {self.experiment!r}: deleted in {self.uri}; "
                                     f"restore it or name another")
            self._experiment_id = (found.experiment_id if found is not None else self._call(
                "creating the experiment", self.client.create_experiment, self.experiment,
                artifact_location=local_artifact_root(self.uri)))
        assert self._experiment_id is not None
        return self._experiment_id

    def _find_or_create(self, source: RunSource) -> tuple[str, bool]:
        if source.run_id in self._runs:
            return self._runs[source.run_id], False
        found = self._call("searching runs", self.client.search_runs, [self.experiment_id()],
                           filter_string=f"tags.`{RUN_TAG}` = '{source.run_id}'",
                           max_results=2)
        if found:
            run = found[0]
            mid = run.info.run_id
            self._params[mid] = set(run.data.params)
            self._tags[mid] = dict(run.data.tags)
            self._logged[mid] = {key: {m.step for m in self._call(
                "reading a metric's history", self.client.get_metric_history, mid, key)}
                for key in run.data.metrics}
            created = False
        else:
            start = int(source.points[0].wall_time * 1000) if (
                source.points and source.points[0].wall_time) else None
            run = self._call("creating the run", self.client.create_run, self.experiment_id(),
                             start_time=start, tags=dict(source.tags), run_name=source.run_id)
            mid = run.info.run_id
            self._params[mid], self._logged[mid] = set(), {}
            self._tags[mid] = dict(source.tags)
            created = True
        self._runs[source.run_id] = mid
        return mid, created

    def track(self, source: RunSource, *, report: bool = True) -> dict[str, Any]:
        """Log what ``source`` has that its MLflow run has not; with ``report``, upload
        the run's HTML report as an artifact when anything new was logged (or it is
        missing). Raises ToolError for a failed call."""
        if self.dry_run:
            return {"experiment": self.experiment, "run_id": None,
                    "params": len(source.params), "steps_logged": len(source.points),
                    "result_logged": bool(source.ended and source.result), "report": report,
                    "note": "dry run: the tracking server was not asked; counts are the run's"}
        from mlflow.entities import Metric, Param, RunTag

        mid, created = self._find_or_create(source)
        have = self._logged[mid]
        params = [Param(k, v) for k, v in source.params.items() if k not in self._params[mid]]
        metrics, steps = [], set()
        for point in source.points:
            stamp = int((point.wall_time or time.time()) * 1000)
            for key, value in point.values.items():
                if point.step not in have.get(key, ()):
                    metrics.append(Metric(key, value, stamp, point.step))
                    steps.add(point.step)
        result_new = bool(source.ended and source.result and source.last_step is not None
                          and not any(k.startswith(RESULT_PREFIX) for k in have))
        if result_new:
            stamp = int((source.points[-1].wall_time or time.time()) * 1000)
            metrics += [Metric(RESULT_PREFIX + k, v, stamp, source.last_step or 0)
                        for k, v in source.result.items()]
        tags = [RunTag(k, v) for k, v in source.tags.items() if self._tags[mid].get(k) != v]
        for i in range(0, max(len(params), 1), PARAMS_PER_CALL):
            chunk = params[i:i + PARAMS_PER_CALL]
            if chunk or (i == 0 and tags):
                self._call("logging parameters", self.client.log_batch, mid, params=chunk,
                           tags=tags if i == 0 else [])
        self._params[mid].update(p.key for p in params)
        self._tags[mid].update(source.tags)
        for i in range(0, len(metrics), METRICS_PER_CALL):
            self._call("logging metrics", self.client.log_batch, mid,
                       metrics=metrics[i:i + METRICS_PER_CALL])
        for m in metrics:
            have.setdefault(m.key, set()).add(m.step)
        uploaded = False
        if report:
            uploaded = self._report(source, mid, changed=bool(metrics or params or created))
        if source.ended:
            status = END_STATUS.get(source.state or "", "FAILED")
            info = self._call("reading the run", self.client.get_run, mid).info
            if info.status != status:
                end = int((source.points[-1].wall_time or time.time()) * 1000) if (
                    source.points) else None
                self._call("ending the run", self.client.set_terminated, mid, status,
                           end_time=end)
        return {"experiment": self.experiment, "run_id": mid, "created": created,
                "params": len(params), "steps_logged": len(steps), "points_logged": len(metrics),
                "result_logged": result_new, "report": uploaded}

    def _report(self, source: RunSource, mid: str, *, changed: bool) -> bool:
        if not changed:
            names = {a.path for a in self._call("listing artifacts", self.client.list_artifacts,
                                                mid)}
            if REPORT_ARTIFACT in names:
                return False
        from hpcdl.report import write_run_report

        with tempfile.TemporaryDirectory(prefix="hpcdl-track-") as tmp:
            target = Path(tmp) / REPORT_ARTIFACT
            write_run_report(source.path, target)
            self._call("uploading the report", self.client.log_artifact, mid, str(target))
        return True
