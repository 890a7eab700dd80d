"""hpcdl.cli.results (`hpcdl results`): its own choices and refusals over a real sweep
directory and a real probe run directory. What the tables hold is
tests/unit/results/test_scaling.py's (scaling) and tests/unit/sweep/test_compare.py's."""

from __future__ import annotations

import json
from pathlib import Path

from tests.unit.clirun import hpcdl
from tests.unit.results.test_scaling import _sweep_dir


def test_json_and_csv_together_is_one_refusal_and_no_table(tmp_path: Path):
    res = hpcdl("results", str(_sweep_dir(tmp_path)), "--no-refresh", "--json", "--csv")
    assert (res.returncode, res.stdout) == (2, "")
    assert res.stderr == "error: --json and --csv: choose one output form\n"


def test_sort_orders_a_scaling_table_with_empty_cells_last(tmp_path: Path):
    sweep = str(_sweep_dir(tmp_path))

    def ips(*sort: str) -> list[float | None]:
        res = hpcdl("results", sweep, "--no-refresh", "--json", *sort)
        assert res.returncode == 0, res.stderr
        return [row["images_per_sec"] for row in json.loads(res.stdout)["rows"]]

    # One point failed and one has no result.json: their cells are empty, last both ways.
    assert ips("--sort", "images_per_sec") == [100.0, 190.0, None, None]
    assert ips("--sort", "-images_per_sec") == [190.0, 100.0, None, None]


def test_sort_by_an_unknown_column_names_the_columns(tmp_path: Path):
    res = hpcdl("results", str(_sweep_dir(tmp_path)), "--no-refresh", "--sort", "-speed")
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith("error: sort: no column 'speed'; columns: label, backend, ")
    assert "images_per_sec" in res.stderr and res.stderr.count("\n") == 1


def test_a_plot_into_a_missing_directory_is_refused_and_nothing_is_written(tmp_path: Path):
    target = tmp_path / "nowhere" / "s.png"
    res = hpcdl("results", str(_sweep_dir(tmp_path)), "--no-refresh", "--plot", str(target))
    assert res.returncode == 2
    assert res.stderr.splitlines()[-1] == (f"error: --plot {target}: directory {target.parent} "
                                          f"does not exist")
    assert not target.parent.exists()


def _probe_run(tmp_path: Path) -> Path:
    """A finished `hpcdl probe` run: result.json with the probe's report, no training."""
    run_dir = tmp_path / "probe-20261123-100000-abc"
    run_dir.mkdir()
    (run_dir / "plan.json").write_text(json.dumps(
        {"backend": "ddp", "nodes": 2, "gpus_per_node": 1, "ntasks": 2}))
    (run_dir / "job.json").write_text(json.dumps({"job_id": "7"}))
    probe = {"world_size": 2, "nodes": ["n1", "n2"], "backend": "gloo", "sizes": [],
             "pairs": [], "slow_nodes": [], "verdict": {"found": False, "message": "no slow node"}}
    (run_dir / "result.json").write_text(json.dumps(
        {"job_id": "7", "state": "COMPLETED", "exit_code": 0, "signal": None,
         "hpcdl_result": None, "probe": probe, "ranks": [], "failed_ranks": []}))
    return run_dir


def test_a_probe_run_has_json_but_no_scaling_csv_or_plot(tmp_path: Path):
    run_dir = _probe_run(tmp_path)
    as_json = hpcdl("results", str(run_dir), "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["probe"]["verdict"]["message"] == "no slow node"
    for extra in (["--csv"], ["--plot", str(tmp_path / "p.png")]):
        res = hpcdl("results", str(run_dir), *extra)
        assert res.returncode == 2 and res.stdout == ""
        assert res.stderr == (f"error: {run_dir}: a probe run has no scaling table (--csv, "
                              f"--plot); use --json or the default tables\n")
    assert not (tmp_path / "p.png").exists()
