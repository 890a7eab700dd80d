"""`hpcdl probe`: an allreduce sweep over an allocation that names slow nodes.

A job like any other (request -> plan -> submit -> follow -> result.json); the worker
is hpcdl/probe/worker.py. This module renders its report (rich tables, or --json) and
is the only place that prints it.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import click

from hpcdl.cli.options import example_options, parse_env, runtime_mode_for
from hpcdl.errors import ValidationError
from hpcdl.probe.request import BACKENDS, DEFAULT_SIZES, MPI_MODES, ProbeOptions
from hpcdl.probe.worker import DEFAULT_SLOW_RATIO, EXIT_BAD_INPUT, format_size


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


def probe_exit(record: dict[str, Any], job_code: int) -> int:
    """The exit status of `hpcdl probe --wait`: 2 when a rank refused its input (its
    line says why), else the job's (0 healthy, 1 a slow node or link)."""
    report = record.get("probe") or {}
    if "error" in report:
        return EXIT_BAD_INPUT
    return job_code


@click.command()
@click.option("--profile", "-p", "profile", metavar="NAME|PATH",
              help="Cluster profile (default: $HPCDL_PROFILE).")
@click.option("--partition", metavar="NAME", help="Partition; default: the smallest that fits.")
@click.option("--nodes", "-N", type=int, default=2, show_default=True,
              help="Nodes to probe (2 or more; 3 or more to name which node is slow).")
@click.option("--gpus", "-G", type=int, default=0, show_default=True,
              help="GPUs per node, one rank each (0: one rank per node, CPU/Gloo).")
@click.option("--time", "-t", metavar="HH:MM:SS", help="Wall time limit (default: the profile's).")
@click.option("--cpus-per-task", "-c", type=int, help="CPUs per rank.")
@click.option("--job-name", "-J", default="hpcdl-probe", show_default=True, help="Slurm job name.")
@example_options
@click.option("--no-image", is_flag=True, help="Run natively, even when the profile names an image.")
@click.option("--sizes", default=DEFAULT_SIZES, show_default=True, metavar="LIST",
              help="Message sizes (bytes, K, M, G; 4 bytes to 1G, whole float32s). The node "
                   "pairs are tested with the largest.")
@click.option("--iters", type=int, default=5, show_default=True, help="Timed calls per size.")
@click.option("--warmup", type=int, default=2, show_default=True, help="Untimed calls first.")
@click.option("--backend", type=click.Choice(BACKENDS), default="auto", show_default=True,
              help="torch.distributed backend: auto is NCCL when the ranks see a GPU, else Gloo.")
@click.option("--mpi", type=click.Choice(MPI_MODES), default="auto", show_default=True,
              help="Also MPI_Allreduce (mpi4py) over the allocation; auto: when mpi4py is in "
                   "the image and srun started the ranks with PMI.")
@click.option("--ifname", metavar="IFACE",
              help="Interface for NCCL and Gloo (NCCL_SOCKET_IFNAME syntax: ib0, eth, =eth0, "
                   "^docker); each node checks it has one (exit 2 if not). Default: the "
                   "profile's interconnect.socket_ifname, else NCCL's/Gloo's own choice.")
@click.option("--slow-ratio", type=float, default=DEFAULT_SLOW_RATIO, show_default=True,
              help="A node whose best link is below this share of the median node's best "
                   "link is slow (exit 1); with 2 nodes, the link against the profile's "
                   "expected bandwidth.")
@click.option("--dry-run", is_flag=True, help="Print the job script and the job-side files it runs (or with --json the plan).")
@click.option("--run-dir", "run_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Run directory (must not exist yet; default: a new one under $HPCDL_RUNS).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--wait", "-w", is_flag=True,
              help="Follow the probe to its end, print its tables and exit 0 (no slow node), "
                   "1 (a slow node or link) or 2 (a node refused the input).")
def probe(profile: str | None, partition: str | None, nodes: int, gpus: int, time: str | None,
          cpus_per_task: int | None, job_name: str, image: str | None, env: tuple[str, ...],
          binds: tuple[str, ...], data: str | None, synthetic: bool,
          example_args: tuple[str, ...], no_image: bool, sizes: str, iters: int, warmup: int,
          backend: str, mpi: str, ifname: str | None, slow_ratio: float, dry_run: bool,
          run_dir: Path | None, as_json: bool, wait: bool) -> None:
    """Measure allreduce bandwidth across an allocation and name slow nodes.

    Runs hpcdl's probe worker (stdlib + torch; no hpcdl needed in the image) on every
    rank: an allreduce sweep over --sizes across the whole allocation
    (torch.distributed: NCCL on GPUs, Gloo on CPUs; and MPI_Allreduce with mpi4py when
    the image has it), then between pairs of nodes: every pair up to 8 nodes; beyond,
    ring neighbours, then each suspect node against a good node (at most 11 rounds,
    about N pairs). It reports time, algorithm
    bandwidth and bus bandwidth (busbw = algbw x 2(n-1)/n, as nccl-tests) per size,
    against the profile's interconnect.expected_busbw_gbs, and the interface and
    transport variables each node used.

    A node whose best link is below --slow-ratio of the median node's best link is
    named (exit 1): all its links are slow. With 2 nodes the one link is compared with
    the profile's expected bandwidth; a third node is needed to tell which end is slow.

    \b
    Examples:
      hpcdl probe -p sandbox -N 2 --image img.sif --sizes 4K,64K,1M --wait
      hpcdl probe -p neuron -N 4 -G 4 --ifname ib0 --wait --json
      hpcdl submit -p neuron -N 4 -G 4 --probe-first -- python3 train.py
    """
    from hpcdl.plan import JobRequest, build_plan
    from hpcdl.probe.request import check_nodes, worker_args
    from hpcdl.profiles import load_profile

    if data or synthetic or example_args:
        raise ValidationError("probe: --data, --synthetic and -X are for the bundled example; "
                              "the probe takes --sizes, --iters, --ifname")
    check_nodes(nodes)
    prof = load_profile(profile)
    args = worker_args(ProbeOptions(sizes=sizes, iters=iters, warmup=warmup, backend=backend,
                                    mpi=mpi, ifname=ifname, slow_ratio=slow_ratio), prof)
    request = JobRequest(
        nodes=nodes, gpus=gpus, partition=partition, time=time, cpus_per_task=cpus_per_task,
        job_name=job_name, image=image, env=parse_env(env), binds=binds, no_image=no_image,
        launcher="srun", requeue=False, probe=args,
        run_dir=str(run_dir.resolve()) if run_dir is not None else None)
    mode = runtime_mode_for(prof, request)
    if dry_run:
        from hpcdl.cli.submit import print_dry_run

        print_dry_run(build_plan(prof, request, runtime_mode=mode), as_json=as_json)
        return
    from hpcdl.cli.submit import submit_and_report
    from hpcdl.submit import plan_run

    plan = plan_run(prof, request, run_name="probe", runtime_mode=mode)
    code = submit_and_report(prof, plan, wait=wait, as_json=as_json, probe_report=True)
    if code:
        raise SystemExit(code)
