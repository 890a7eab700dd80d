"""The sandbox cluster's files, rendered from its model (hpcdl.sandbox.cluster) with
the templates under templates/sandbox/: slurm.conf, gres.conf, slurmdbd.conf, the
/etc/hosts block, the bash variables scripts/sandbox.sh sources, and the bundled
``sandbox`` profile. Pure: text in, text out; the CLI (`hpcdl sandbox render`) writes.
"""

from __future__ import annotations

from typing import Any

from hpcdl.core.templating import render_template
from hpcdl.sandbox.cluster import (
    DEFAULT_DIR,
    DEFAULT_SHAPE,
    Cluster,
    Shape,
    check_host,
    profile_partitions,
)

# A local-only database bound to 127.0.0.1 and a root-only config file: not a secret.
DB_PASSWORD = "hpcdl-sandbox"
# The files `render` writes for scripts/sandbox.sh, each from templates/sandbox/NAME.j2.
FILES = ("slurm.conf", "gres.conf", "slurmdbd.conf", "hosts", "cluster.sh")


def hosts_markers(cluster: Cluster) -> tuple[str, str]:
    """The lines around the cluster's block in /etc/hosts (up writes it, down removes
    it; no other line is touched)."""
    return f"# >>> hpcdl-sandbox {cluster.tag}", f"# <<< hpcdl-sandbox {cluster.tag}"


def _gpu_counts(shape: Shape) -> str:
    counts = {n.gpus for n in shape.nodes if n.gpus}
    return f"{counts.pop()} fake GPUs per node" if len(counts) == 1 else "fake GPUs"


def _context(cluster: Cluster, host: str) -> dict[str, Any]:
    shape = cluster.shape
    cpus = {n.cpus for n in shape.nodes}
    begin, end = hosts_markers(cluster)
    return {"cluster": cluster, "shape": shape, "host": check_host(host),
            "advertised": f"{cpus.pop()} CPUs per node" if len(cpus) == 1 else "each node's CPUs",
            "partition_lines": [p.slurm_line() for p in shape.partitions],
            "gres_nodes": [n for n in shape.nodes if n.gpus and n.state != "nogres"],
            "counts": _gpu_counts(shape), "db_password": DB_PASSWORD,
            "hosts_begin": begin, "hosts_end": end, "default_dir": DEFAULT_DIR}


def render_files(cluster: Cluster, host: str) -> dict[str, str]:
    """Every file of FILES for ``cluster`` on the machine named ``host`` (short name).
    Raises ValidationError for a host name that is not one token, RenderError for a
    broken template."""
    context = _context(cluster, host)
    return {name: render_template(f"sandbox/{name}.j2", context) for name in FILES}


def _flow(entry: dict[str, Any]) -> str:
    """One YAML flow mapping, as the bundled profiles write partitions (a time quoted:
    YAML 1.1 reads 00:30:00 as a number)."""
    def value(key: str, v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        return f'"{v}"' if key == "max_time" else str(v)
    return "{" + ", ".join(f"{k}: {value(k, v)}" for k, v in entry.items()) + "}"


# The default sandbox's login node (scripts/sandbox-login.sh: the bridge's .250).
LOGIN_HOST = "10.77.0.250"


def bundled_profile(shape: Shape = DEFAULT_SHAPE, *, remote: bool = False) -> str:
    """hpcdl/profiles/bundled/sandbox.yaml: the profile of the default sandbox; with
    ``remote``, sandbox-remote.yaml: the same cluster through its SSH login node."""
    parts = profile_partitions(shape)
    default = next(p for p in shape.partitions if p.default)
    tier = {p.name: 1 if p.priority_tier is None else p.priority_tier for p in shape.partitions}
    preempted = [p.name for p in shape.partitions if p.preempt_mode == "REQUEUE"]
    return render_template("sandbox/sandbox.yaml.j2", {
        "shape": shape, "partitions": [(p["name"], _flow(p)) for p in parts],
        # Slurm's TmpFS of the default cluster (slurm.conf.j2), bound into containers.
        "tmpfs": f"{DEFAULT_DIR}/tmp",
        "default_time": default.default_time, "preempted": preempted,
        # Slurm's PriorityTier is 1 where a partition sets none.
        "preemptors": {name: [p for p in tier if tier[p] > tier[name]] for name in preempted},
        "grace": {p.name: p.grace_time for p in shape.partitions},
        "login": {"host": LOGIN_HOST} if remote else None})
