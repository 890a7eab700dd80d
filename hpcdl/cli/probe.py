"""`hpcdl probe`: an allreduce sweep over an allocation that names slow nodes.

A job like any other (request -> plan -> submit -> follow -> result.json); the worker
is hpcdl/jobside/probe_worker.py. Its report is printed as tables by hpcdl.cli.display's
probe_view (or as JSON with --json).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click

from hpcdl.cli import options
from hpcdl.cli.options import PROBE, Output, SectionedCommand, opt
from hpcdl.cli.submit import echo_warning, print_dry_run, submit_and_show
from hpcdl.jobs.prepare import open_cluster, prepare_job
from hpcdl.jobside.protocol import DEFAULT_SLOW_RATIO
from hpcdl.plan import (
    ContainerRequest,
    FilesRequest,
    JobRequest,
    LaunchRequest,
    PlacementRequest,
    ProbeRequest,
    ResilienceRequest,
)
from hpcdl.probe.request import (
    DEFAULT_SIZES,
    DIST_BACKENDS,
    MPI_MODES,
    ProbeOptions,
    check_nodes,
    worker_args,
)
from hpcdl.profiles import load_profile


@click.command(cls=SectionedCommand)
@options.placement(
    nodes=opt("--nodes", "-N", type=int, default=2, show_default=True,
              help="Nodes to probe (2 or more; 3 or more to name the slow one)."),
    gpus=opt("--gpus", "-G", type=int, default=0, show_default=True,
             help="GPUs per node, one rank each (0: one rank per node, Gloo)."),
    time="Wall time limit (default: the profile's).",
    cpus_per_task="CPUs per rank.",
    job_name=opt("--job-name", "-J", default="hpcdl-probe", show_default=True,
                 help="Job name (as the scheduler shows it)."))
@options.container("image", "no_image", "binds")
@options.launch("env")
@options.section(
    PROBE,
    opt("--sizes", default=DEFAULT_SIZES, show_default=True, metavar="LIST",
        help="Message sizes (4 bytes to 1G, whole float32s); pairs use the largest."),
    opt("--iters", type=int, default=5, show_default=True, help="Timed calls per size."),
    opt("--warmup", type=int, default=2, show_default=True, help="Untimed calls first."),
    opt("--backend", type=click.Choice(DIST_BACKENDS), default="auto", show_default=True,
        help="torch.distributed backend (auto: NCCL with GPUs, else Gloo)."),
    opt("--mpi", type=click.Choice(MPI_MODES), default="auto", show_default=True,
        help="Also MPI_Allreduce (auto: when mpi4py and PMI are there)."),
    opt("--ifname", metavar="IFACE",
        help="Interface for NCCL and Gloo (NCCL_SOCKET_IFNAME syntax; default: the "
             "profile's)."),
    opt("--slow-ratio", type=float, default=DEFAULT_SLOW_RATIO, show_default=True,
        help="Slow below this share of the median node's best link (exit 1)."),
    part="measure", build=ProbeOptions)
@options.output(
    dry_run="Print the job script and the files it runs (or the plan, --json).",
    wait="Follow the probe; exit 0 (no slow node), 1 (slow) or 2 (input refused).")
def probe(profile: str | None, placement: PlacementRequest, files: FilesRequest,
          container: ContainerRequest, launch: LaunchRequest, measure: ProbeOptions,
          output: Output) -> None:
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
    check_nodes(placement.nodes)
    prof = load_profile(profile)
    args = worker_args(measure, prof)
    # The probe is srun's, and a measurement is not requeued.
    request = JobRequest(placement=placement, container=container,
                         launch=replace(launch, launcher="srun"),
                         resilience=ResilienceRequest(requeue=False),
                         probe=ProbeRequest(args=args), files=files)
    run_dir = Path(files.run_dir) if files.run_dir is not None else None
    cluster = open_cluster(prof, "probe", dry_run=output.dry_run, run_dir=run_dir)
    ready = prepare_job(prof, request, cluster, run_name="probe", check_image=False,
                        on_warning=echo_warning)
    if ready.notes is not None:
        print_dry_run(ready.plan, as_json=output.as_json, notes=ready.notes)
        return
    code = submit_and_show(prof, ready.plan, wait=output.wait, as_json=output.as_json,
                           probe=True, conn=ready.conn)
    if code:
        raise SystemExit(code)
