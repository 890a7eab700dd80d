"""`hpcdl track`: runs' per-step metrics, parameters, result and report into TensorBoard
event files or MLflow (hpcdl.track does the work; this module parses and prints)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from hpcdl.errors import ValidationError


@click.command()
@click.argument("paths", nargs=-1, required=True, metavar="RUN_DIR|SWEEP_DIR...",
                type=click.Path(path_type=Path))
@click.option("--tensorboard", "tb_dir", type=click.Path(file_okay=False, path_type=Path),
              metavar="DIR", help="Write TensorBoard event files here, one subdirectory per "
                                  "run (tensorboard --logdir DIR shows them).")
@click.option("--mlflow", "mlflow_uri", metavar="URI",
              help="Log to this MLflow tracking server (http://HOST:PORT) or local store "
                   "(sqlite:///PATH/mlflow.db, file:///PATH).")
@click.option("--experiment", default="hpcdl", show_default=True, metavar="NAME",
              help="MLflow experiment (made when missing).")
@click.option("--follow", "-f", is_flag=True,
              help="Keep logging new steps while the jobs run; stop when every job ended.")
@click.option("--interval", type=float, default=10.0, show_default=True, metavar="S",
              help="--follow: seconds between passes.")
@click.option("--dry-run", is_flag=True, help="Say what would be written; write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print what was tracked as JSON.")
def track(paths: tuple[Path, ...], tb_dir: Path | None, mlflow_uri: str | None,
          experiment: str, follow: bool, interval: float, dry_run: bool,
          as_json: bool) -> None:
    """Export runs to TensorBoard or MLflow from where the network is (the login node,
    a laptop with the run directories pulled back), never from the compute nodes.

    Each hpcdl run becomes one TensorBoard run (DIR/<run directory's name>) and one
    MLflow run (tag hpcdl.run_id): its parameters (plan.json: nodes, GPUs, backend, the
    command and each of its --options as arg.NAME), its per-step series (loss and lr of
    rank 0; images_per_sec summed over the ranks; step_s, data_s, sync_s of the
    slowest rank), the result line's figures (result.*) once the job ended, and in
    MLflow the HTML report as an artifact. Tracking again writes only what is new. A
    sweep directory tracks every point; in TensorBoard's HPARAMS tab each run is a
    session with its hparams (an `hpcdl sweep` point's --param values, else the run's
    parameters) and its metrics' last values (result/final_loss, ...) side by side.

    Needs the optional packages: pip install 'hpcdl[tensorboard]' or 'hpcdl[mlflow]'.

    \b
    Examples:
      hpcdl track runs/hpcdl-20261124-061500-ab12cd --tensorboard tb/
      hpcdl track runs/sweep-20261124-061500-ab12 --mlflow http://127.0.0.1:5000
      hpcdl track RUN_DIR --mlflow sqlite:///$HOME/mlflow.db --follow
    """
    from hpcdl.track.run import Sinks, track_once
    from hpcdl.track.run import follow as follow_runs
    from hpcdl.track.source import find_runs

    if tb_dir is None and not mlflow_uri:
        raise ValidationError("track: neither --tensorboard DIR nor --mlflow URI given; "
                              "name at least one")
    if interval <= 0:
        raise ValidationError(f"interval: {interval:g} must be above 0 seconds")
    if follow and dry_run:
        raise ValidationError("--follow and --dry-run: a dry run is one pass; drop one")
    runs = find_runs(list(paths))
    sinks = Sinks(dry_run=dry_run)
    if tb_dir is not None:
        from hpcdl.track.to_tensorboard import TensorBoardSink

        if tb_dir.exists() and not tb_dir.is_dir():
            raise ValidationError(f"--tensorboard {tb_dir}: exists and is not a directory")
        sinks.tensorboard = TensorBoardSink(tb_dir)
    if mlflow_uri:
        from hpcdl.track.to_mlflow import MlflowSink

        sinks.mlflow = MlflowSink(mlflow_uri, experiment, dry_run=dry_run)
    try:
        if follow:
            from hpcdl.sweep.run import connection_for

            conn = connection_for(runs[0])

            def cycle(entries: list[dict[str, Any]], running: int) -> None:
                if not as_json:
                    for entry in entries:
                        if _wrote(entry):
                            click.echo(_line(entry, dry_run), err=True)
                    if running:
                        click.echo(f"following: {running} run(s) still going", err=True)

            tracked = follow_runs(runs, sinks, scheduler=conn.scheduler, place=conn.place,
                                  interval=interval, on_cycle=cycle)
        else:
            tracked = track_once(runs, sinks)
    finally:
        sinks.close()
    if as_json:
        click.echo(json.dumps({"dry_run": dry_run, "runs": tracked}, indent=2))
        return
    for entry in tracked:
        click.echo(_line(entry, dry_run))


def _wrote(entry: dict[str, Any]) -> bool:
    return any(entry.get(s, {}).get(k) for s in ("tensorboard", "mlflow")
               for k in ("steps_written", "hparams_written", "steps_logged", "result_logged",
                         "report"))


def _line(entry: dict[str, Any], dry_run: bool) -> str:
    verb = "would write" if dry_run else "wrote"
    parts = [f"{entry['run']} ({entry['steps']} steps, {entry['ranks']} ranks, "
             f"{entry['state'] or 'no result yet'}):"]
    tb = entry.get("tensorboard")
    if tb is not None:
        parts.append(f"tensorboard {tb['dir']}: {verb} {tb['steps_written']} new steps"
                     f"{', the hparams' if tb.get('hparams_written') else ''};")
    ml = entry.get("mlflow")
    if ml is not None:
        if dry_run:
            parts.append(f"mlflow experiment {ml['experiment']}: {verb} up to "
                         f"{ml['params']} params, {ml['steps_logged']} steps"
                         f"{', the result' if ml['result_logged'] else ''}"
                         f"{', the report' if ml['report'] else ''} (server not asked)")
        else:
            made = "new run" if ml["created"] else "run"
            parts.append(f"mlflow {made} {ml['run_id']} in {ml['experiment']}: {verb} "
                         f"{ml['params']} params, {ml['steps_logged']} new steps"
                         f"{', the result' if ml['result_logged'] else ''}"
                         f"{', the report' if ml['report'] else ''}")
    return " ".join(parts).rstrip(";")
