"""`hpcdl sandbox up|down|status`: the local two-node Slurm cluster (scripts/sandbox.sh)."""

from __future__ import annotations

import click

from hpcdl.errors import ToolError


def _script() -> str:
    """scripts/sandbox.sh: in the checkout, or under hpcdl/_data in the wheel."""
    from hpcdl.resources import data_dir

    path = data_dir("scripts") / "sandbox.sh"
    if not path.is_file():
        raise ToolError(f"sandbox: {path} is missing from this installation",
                        hint="run from a checkout of hpcdl: scripts/sandbox.sh up")
    return str(path)


def _run(action: str) -> None:
    from hpcdl import proc

    try:
        proc.stream(["bash", _script(), action], on_line=lambda line: click.echo(line, nl=False),
                    timeout=900)
    except ToolError as err:
        # The script already printed the log lines that explain the failure.
        raise ToolError(f"sandbox {action} failed (exit {err.returncode})",
                        hint="see the lines above; logs under $HPCDL_SANDBOX_DIR "
                             "(/var/lib/hpcdl-sandbox/log)") from err


@click.group()
def sandbox() -> None:
    """A real two-node Slurm cluster on this machine (nodes n1, n2; 4 fake GPUs each).

    Each node runs in its own network namespace (n1 10.77.0.11, n2 10.77.0.12, on a
    bridge holding 10.77.0.1) and its name resolves (a marked block in /etc/hosts).
    Matches the bundled `sandbox` profile: partitions debug (default), gpu and
    short. Needs root; installs munge, Slurm and MariaDB when missing. To slow one
    node's link: scripts/sandbox.sh shape NODE --rate MBIT (see the README).
    """


@sandbox.command()
def up() -> None:
    """Start the cluster (idempotent: a no-op when it is already up)."""
    _run("up")


@sandbox.command()
def down() -> None:
    """Stop the sandbox's own daemons (by PID file), then remove its network."""
    _run("down")


@sandbox.command(name="status")
def status_cmd() -> None:
    """Show the daemons, each node's address and link, and the nodes as Slurm sees
    them; exit 3 when the cluster is not up."""
    from hpcdl import proc

    res = proc.run(["bash", _script(), "status"], timeout=60, check=False)
    click.echo(res.stdout, nl=False)
    if res.returncode:
        raise SystemExit(res.returncode)
