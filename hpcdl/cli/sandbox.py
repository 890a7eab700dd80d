"""`hpcdl sandbox up|down|status`: the local Slurm cluster (scripts/sandbox.sh): the
two-node sandbox, or with --nodes N a cluster of N nodes in a directory of its own.
The clusters themselves are data (hpcdl.sandbox.cluster); the hidden `render` renders
their files for sandbox.sh."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import click

from hpcdl.errors import ToolError, ValidationError

NODES_HELP = ("A cluster of N nodes (1 to 200) in its own directory "
              "(/var/lib/hpcdl-sandbox-Nn), beside the two-node sandbox; without it, "
              "the two-node sandbox.")


def _script(name: str = "sandbox.sh") -> str:
    """scripts/NAME (sandbox.sh, sandbox-login.sh): in the checkout, or under hpcdl/_data
    in the wheel."""
    from hpcdl.core.resources import data_dir

    path = data_dir("scripts") / name
    if not path.is_file():
        raise ToolError(f"sandbox: {path} is missing from this installation",
                        hint="run from a checkout of hpcdl: scripts/sandbox.sh up")
    return str(path)


def _script_env(env: dict[str, str] | None) -> dict[str, str]:
    """sandbox.sh renders the cluster's files with this Python (which has hpcdl)."""
    return {"HPCDL_SANDBOX_PYTHON": sys.executable, **(env or {})}


def _run(action: str, env: dict[str, str] | None = None, script: str = "sandbox.sh") -> None:
    from hpcdl.core import proc

    try:
        proc.stream(["bash", _script(script), action],
                    on_line=lambda line: click.echo(line, nl=False),
                    timeout=900, env=_script_env(env))
    except ToolError as err:
        # The script already printed the log lines that explain the failure.
        folder = (env or {}).get("HPCDL_SANDBOX_DIR", "/var/lib/hpcdl-sandbox")
        raise ToolError(f"sandbox {action} failed (exit {err.returncode})",
                        hint=f"see the lines above; logs under {folder}/log") from err


def _free_subnet() -> str:
    from hpcdl.core import proc
    from hpcdl.sandbox import pick_subnet

    return pick_subnet(proc.run(["ip", "-o", "-4", "addr", "show"], timeout=30).stdout)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free ports (each socket held open until all are picked)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _folder(nodes: int, folder: Path | None, release: str | None = None) -> Path:
    from hpcdl import sandbox as shape

    return folder.resolve() if folder else shape.cluster_dir(nodes, release)


def _slurm_root(release: str) -> str:
    """The release's root filesystem, built the first time (scripts/slurm-rootfs.sh,
    cached by content: later calls return at once); its progress goes to stderr."""
    from hpcdl.core import proc

    res = proc.run(["bash", _script("slurm-rootfs.sh"), release], timeout=1800)
    lines = res.stdout.strip().splitlines()
    if res.stderr.strip():
        click.echo(res.stderr.rstrip(), err=True)
    if not lines or not Path(lines[-1], "hpcdl", "sbin", "slurmd").is_file():
        raise ToolError(f"slurm-rootfs.sh {release} printed no root filesystem ({res.stdout!r})")
    return lines[-1]


def _expedite(release: str | None) -> bool:
    """Whether a cluster of ``release`` enables --requeue=expedite: every release that
    has it (the release table's; the host's 22.05 has not)."""
    from hpcdl.schedulers.slurm.releases import profile_behaviour

    return release is not None and profile_behaviour(release).requeue_expedite


def _existing_env(folder: Path) -> dict[str, str] | None:
    """The environment the cluster in ``folder`` was started with, if it exists."""
    from hpcdl import sandbox as shape

    path = folder / shape.ENV_FILE
    if not path.is_file():
        return None
    return shape.parse_env_file(path.read_text())


def _prepare(nodes: int, folder: Path, release: str | None = None,
             slurm_root: str | None = None) -> tuple[dict[str, str], Path]:
    """The cluster's directory, shape, environment file and profile: made once, then
    reused by every later `up`, so the subnet and ports stay what the running cluster
    has. Returns the environment and the profile's path."""
    import yaml

    from hpcdl import sandbox as shape
    from hpcdl.core.atomic import write_atomic
    from hpcdl.profiles.loader import load_profile_file, user_profiles_dir
    from hpcdl.sandbox.cluster import parse_shape

    env = _existing_env(folder)
    if env is not None and len(parse_shape((folder / shape.SHAPE_FILE).read_text()).nodes) != nodes:
        raise ValidationError(f"dir: {folder} holds a sandbox of another size than {nodes} nodes",
                              hint="hpcdl sandbox down with its --nodes, or another --dir")
    if env is not None and slurm_root and env.get("HPCDL_SANDBOX_SLURM_ROOT") != slurm_root:
        # A rebuilt root (this script or the release changed): the stopped cluster's
        # environment follows it; a running one keeps its daemons until `down`.
        env["HPCDL_SANDBOX_SLURM_ROOT"] = slurm_root
        write_atomic(folder / shape.ENV_FILE, shape.env_file_text(env))
    if env is None:
        folder.mkdir(parents=True, exist_ok=True)
        # A release's cluster has accounting, as the host's 22.05 sandbox (its own
        # slurmdbd and MariaDB: the ports each its own, beside every other cluster's).
        dbd_port, db_port = _free_ports(2)
        env = shape.environment(folder, nodes, _free_port(), release, slurm_root,
                                _expedite(release), (dbd_port, db_port) if release else None)
        write_atomic(folder / shape.SHAPE_FILE, shape.shape_text(nodes, _free_subnet(), release))
        write_atomic(folder / shape.ENV_FILE, shape.env_file_text(env))
    bundled = Path(__file__).resolve().parents[1] / "profiles" / "bundled" / "sandbox.yaml"
    data = shape.profile_data(yaml.safe_load(bundled.read_text()), nodes, folder, release,
                              shape.root_has_pmix(env.get("HPCDL_SANDBOX_SLURM_ROOT")),
                              env.get("HPCDL_SANDBOX_EXPEDITE") == "yes")
    how = f"--slurm {release} --nodes {nodes}" if release else f"--nodes {nodes}"
    text = (f"# Written by `hpcdl sandbox up {how}`; matches {folder}/etc/slurm.conf.\n"
            + yaml.safe_dump(data, sort_keys=False))
    target = user_profiles_dir() / f"{shape.profile_name(nodes, release)}.yaml"
    target.parent.mkdir(parents=True, exist_ok=True)
    staged = folder / "profile.yaml"
    write_atomic(staged, text)
    load_profile_file(staged)  # the schema's own check before it becomes the user's
    write_atomic(target, text)
    return env, target


def _need_env(nodes: int, folder: Path | None, release: str | None = None) -> dict[str, str]:
    from hpcdl import sandbox as shape

    shape.check_nodes(nodes)
    if release:
        shape.check_release(release)
    where = _folder(nodes, folder, release)
    env = _existing_env(where)
    if env is None:
        what = f"Slurm {release} sandbox" if release else f"sandbox of {nodes} nodes"
        how = f"--slurm {release}" if release else f"--nodes {nodes}"
        raise ValidationError(f"nodes: no {what} in {where}", hint=f"hpcdl sandbox up {how}")
    return env


SLURM_OPTION = click.option(
    "--slurm", "release", metavar="RELEASE",
    help="Another Slurm release's cluster (24.11 or 26.05; default: the host's 22.05): "
         "its daemons and commands from a Debian root filesystem of that release "
         "(scripts/slurm-rootfs.sh, built once), in /var/lib/hpcdl-sandbox-RELEASE, "
         "nodes vRRRRn1.. (--nodes, default 2), profile sandbox-RELEASE.")


DIR_OPTION = click.option("--dir", "folder", type=click.Path(file_okay=False, path_type=Path),
                          help="With --nodes: the cluster's directory (default "
                               "/var/lib/hpcdl-sandbox-Nn).")


@click.group()
def sandbox() -> None:
    """A real Slurm cluster on this machine: the two-node sandbox, or with --nodes N
    a cluster of N nodes beside it.

    Each node runs in its own network namespace on the cluster's bridge, and its name
    resolves (a marked block in /etc/hosts). The two-node sandbox is the bundled
    `sandbox` profile's cluster (both are generated from DEFAULT_SHAPE in
    hpcdl/sandbox/cluster.py; `scripts/sandbox.sh config` prints its slurm.conf).
    `up --nodes 32` starts nodes s32n1..s32n32 (each like the sandbox's; one default
    partition) in /var/lib/hpcdl-sandbox-32n with no accounting daemons, writes the
    profile `sandbox-32n` among your profiles and prints how to point Slurm's commands
    at it (SLURM_CONF). Needs root; installs munge, Slurm and MariaDB when missing. To
    slow one node's link: scripts/sandbox.sh shape NODE --rate MBIT (see
    docs/guide/sandbox.md), with the cluster's environment.
    """


def _no_dir_without_nodes(nodes: int | None, folder: Path | None) -> None:
    if folder is not None and nodes is None:
        raise ValidationError("dir: --dir goes with --nodes (the two-node sandbox lives in "
                              "/var/lib/hpcdl-sandbox)")


@sandbox.command()
@click.option("--nodes", "-N", type=int, metavar="N", help=NODES_HELP)
@DIR_OPTION
@SLURM_OPTION
@click.option("--login", is_flag=True,
              help="Also start the two-node sandbox's login node: an OpenSSH server (key-only, "
                   "your own ~/.ssh/authorized_keys) in its own network namespace at "
                   "10.77.0.250, with Slurm's commands, which the `sandbox-remote` profile "
                   "reaches the way a laptop reaches a cluster.")
def up(nodes: int | None, folder: Path | None, release: str | None, login: bool) -> None:
    """Start the cluster (idempotent: a no-op when it is already up)."""
    if release is not None:
        _up_release(release, nodes or 2, folder, login)
        return
    _no_dir_without_nodes(nodes, folder)
    if login and nodes is not None:
        raise ValidationError("login: --login starts the two-node sandbox's login node (the "
                              "sandbox-remote profile's); not with --nodes")
    if nodes is None:
        _run("up")
        if login:
            _run("up", script="sandbox-login.sh")
        return
    from hpcdl import sandbox as shape

    shape.check_nodes(nodes)
    env, profile = _prepare(nodes, _folder(nodes, folder))
    _run("up", env)
    where = env["HPCDL_SANDBOX_DIR"]
    click.echo(f"sandbox of {nodes} node{'s' if nodes > 1 else ''} up in {where}; "
               f"profile {shape.profile_name(nodes)}: {profile}")
    click.echo(f"its Slurm: export SLURM_CONF={env['SLURM_CONF']}")
    click.echo(f"its environment (for scripts/sandbox.sh shape|status|down): "
               f"set -a; . {where}/{shape.ENV_FILE}; set +a")
    click.echo(f"e.g.: SLURM_CONF={env['SLURM_CONF']} hpcdl submit -p "
               f"{shape.profile_name(nodes)} -N {nodes} -G 1 --no-image --wait -- hostname")


def _up_release(release: str, nodes: int, folder: Path | None, login: bool) -> None:
    from hpcdl import sandbox as shape

    shape.check_release(release)
    shape.check_nodes(nodes)
    if login:
        raise ValidationError("login: --login starts the two-node sandbox's login node; "
                              "not with --slurm")
    env, profile = _prepare(nodes, _folder(nodes, folder, release), release,
                            _slurm_root(release))
    _run("up", env)
    where = env["HPCDL_SANDBOX_DIR"]
    name = shape.profile_name(nodes, release)
    click.echo(f"Slurm {release} sandbox of {nodes} node{'s' if nodes > 1 else ''} up in "
               f"{where}; profile {name}: {profile}")
    click.echo(f"its Slurm commands: {shape.commands_dir(Path(where))}/ (sbatch, srun, ...)")
    click.echo(f"e.g.: hpcdl submit -p {name} -N {nodes} -G 1 --no-image --wait -- hostname")


@sandbox.command()
@click.option("--nodes", "-N", type=int, metavar="N", help=NODES_HELP)
@DIR_OPTION
@SLURM_OPTION
def down(nodes: int | None, folder: Path | None, release: str | None) -> None:
    """Stop the sandbox's own daemons (by PID file), then remove its network."""
    if release is not None:
        _run("down", _need_env(nodes or 2, folder, release))
        return
    _no_dir_without_nodes(nodes, folder)
    _run("down", None if nodes is None else _need_env(nodes, folder))


@sandbox.command(name="status")
@click.option("--nodes", "-N", type=int, metavar="N", help=NODES_HELP)
@DIR_OPTION
@SLURM_OPTION
def status_cmd(nodes: int | None, folder: Path | None, release: str | None) -> None:
    """Show the daemons, each node's address and link, and the nodes as Slurm sees
    them; exit 3 when the cluster is not up."""
    from hpcdl.core import proc

    if release is not None:
        env: dict[str, str] | None = _need_env(nodes or 2, folder, release)
    else:
        _no_dir_without_nodes(nodes, folder)
        env = None if nodes is None else _need_env(nodes, folder)
    res = proc.run(["bash", _script(), "status"], timeout=60, check=False, env=_script_env(env))
    click.echo(res.stdout, nl=False)
    if res.returncode:
        raise SystemExit(res.returncode)


@sandbox.command(hidden=True)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Write slurm.conf, gres.conf, slurmdbd.conf, hosts (the /etc/hosts "
                   "block) and cluster.sh (the variables sandbox.sh sources) here.")
@click.option("--bundled-profile", is_flag=True,
              help="Print the bundled `sandbox` profile generated from the default "
                   "cluster (hpcdl/profiles/bundled/sandbox.yaml) instead.")
@click.option("--remote", is_flag=True,
              help="With --bundled-profile: the `sandbox-remote` profile (the same cluster "
                   "through its SSH login node; hpcdl/profiles/bundled/sandbox-remote.yaml).")
def render(out: Path | None, bundled_profile: bool, remote: bool) -> None:
    """The cluster's files from its model (hpcdl.sandbox.cluster), for scripts/sandbox.sh.

    The cluster is the one sandbox.sh's environment names: HPCDL_SANDBOX_SHAPE (a shape
    file; default: the two-node sandbox), HPCDL_SANDBOX_DIR, _CLUSTER, _CTLD_PORT,
    _DBD_PORT, _DB_PORT, _ACCOUNTING. A bad shape or value is one line on stderr
    ("sandbox: ..."), exit 2, and nothing is written.
    """
    from hpcdl.core.atomic import write_atomic
    from hpcdl.sandbox.cluster import Cluster
    from hpcdl.sandbox.render import bundled_profile as profile_text
    from hpcdl.sandbox.render import render_files

    if bundled_profile:
        click.echo(profile_text(remote=remote), nl=False)
        return
    if out is None:
        raise click.UsageError("give --out DIR or --bundled-profile")
    path = os.environ.get("HPCDL_SANDBOX_SHAPE")
    try:
        text = Path(path).read_text() if path else None
    except (OSError, UnicodeDecodeError) as err:
        click.echo(f"sandbox: cannot read {path}: {getattr(err, 'strerror', None) or err}",
                   err=True)
        raise SystemExit(2) from err
    try:
        files = render_files(Cluster.from_env(os.environ, text),
                             socket.gethostname().split(".")[0])
    except ValidationError as err:
        click.echo(f"sandbox: {err}", err=True)
        raise SystemExit(2) from err
    out.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        write_atomic(out / name, content, mode=0o600)
