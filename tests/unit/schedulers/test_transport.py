"""The transport (hpcdl.schedulers.executor): local and SSH are two implementations of
one Executor, and nothing outside hpcdl/remote/ and the transport module names SSH or
asks a profile's login: block whether the cluster is remote."""

from __future__ import annotations

import ast
from pathlib import Path

from hpcdl.profiles import load_profile
from hpcdl.schedulers.executor import LOCAL, Executor, LocalExecutor, executor_for


def test_a_local_push_copies_and_a_pull_leaves_out_what_it_is_told(tmp_path: Path) -> None:
    src = tmp_path / "run"
    (src / "job").mkdir(parents=True)
    (src / "job" / "x.sh").write_text("echo hi\n")
    (src / "job.sbatch").write_text("#!/bin/sh\n")
    (src / "link").symlink_to("job.sbatch")
    moved = LOCAL.push(src, str(tmp_path / "there" / "run"))
    assert moved == len("echo hi\n") + len("#!/bin/sh\n")
    there = tmp_path / "there" / "run"
    assert (there / "job" / "x.sh").read_text() == "echo hi\n"
    assert (there / "link").is_symlink() and (there / "link").readlink() == Path("job.sbatch")
    (there / "out.log").write_text("done\n")
    back = tmp_path / "back"
    assert LOCAL.pull(str(there), back, exclude=("/job/",)) == len("done\n") + len("#!/bin/sh\n")
    assert (back / "out.log").read_text() == "done\n" and not (back / "job").exists()


def test_a_push_onto_the_same_directory_moves_nothing(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("x")
    assert LOCAL.push(tmp_path, str(tmp_path)) == 0
    assert LOCAL.pull(str(tmp_path), tmp_path) == 0
    assert (tmp_path / "a.txt").read_text() == "x"


def test_local_and_ssh_are_two_executors_picked_by_the_profile() -> None:
    here: Executor = executor_for(load_profile("sandbox"))
    assert isinstance(here, LocalExecutor) and not here.remote
    assert here.where == "this machine"
    there: Executor = executor_for(load_profile("sandbox-remote"))
    assert there.remote and there.target == "10.77.0.250"
    assert there.where.startswith("login node 10.77.0.250")
    # A program on a terminal: here as it is, with its environment; there over ssh -t
    # with the environment set by `env` on the remote side.
    assert here.terminal(["salloc", "sh"], {"A": "1"}) == (["salloc", "sh"], {"A": "1"})
    argv, env = there.terminal(["salloc", "sh"], {"A": "1"})
    assert argv[:2] == ["ssh", "-t"] and argv[-1] == "env A=1 salloc sh" and env == {}


# -- the seam: nothing above the transport asks whether the cluster is remote ------------

ROOT = Path(__file__).resolve().parents[3] / "hpcdl"
# Where SSH may be named: the SSH transport itself and the module that picks a transport.
TRANSPORT = ("remote/", "schedulers/executor.py")
# Modules that read a profile's login: block, each with why. Anything else asks the
# Cluster handle (hpcdl.jobs.cluster) or the transport (executor.remote, .target).
LOGIN_READERS = {
    "jobs/cluster.py": "the Cluster handle: it owns the login: block for everything above "
                       "it (runs and images directories, the hang-watch refusal's words)",
    "profiles/schema.py": "defines the login: block (and code_limit_bytes, its default)",
    "cli/profiles.py": "profiles diff compares a profile with the cluster behind its own "
                       "login node: the block is what it reads and passes to detection",
    "cli/push.py": "push copies into the login node's images directory (login.images): "
                   "SSH's own command; a profile without login: is refused in one line",
}
SSH_NAMES = {"SshExecutor", "LoginNode", "ssh_argv", "rsync_argv", "terminal_argv"}


def _outside_the_transport() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py")
                  if not str(p.relative_to(ROOT)).startswith(TRANSPORT))


def _remote_questions(module: str, root: Path = ROOT) -> tuple[list[str], list[str]]:
    """(where SSH is named or a transport's type is asked, where a login: block is
    read) in ``module``'s code, as 'line: what'."""
    tree = ast.parse((root / module).read_text(encoding="utf-8"))
    ssh, login = [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "hpcdl.remote.ssh":
            ssh.append(f"{node.lineno}: imports hpcdl.remote.ssh")
        elif isinstance(node, ast.Import) and any(a.name == "hpcdl.remote.ssh"
                                                  for a in node.names):
            ssh.append(f"{node.lineno}: imports hpcdl.remote.ssh")
        elif isinstance(node, ast.Name) and node.id in SSH_NAMES:
            ssh.append(f"{node.lineno}: names {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in SSH_NAMES:
            ssh.append(f"{node.lineno}: names {node.attr}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id == "isinstance" and len(node.args) == 2
              and "Executor" in ast.unparse(node.args[1])):
            ssh.append(f"{node.lineno}: asks a transport's type ({ast.unparse(node)})")
        elif isinstance(node, ast.Attribute) and node.attr in ("login", "ssh"):
            login.append(f"{node.lineno}: reads {ast.unparse(node)}")
    return ssh, sorted(login, key=lambda hit: int(hit.split(":")[0]))


def test_nothing_outside_the_transport_names_ssh() -> None:
    hits = {m: found for m in _outside_the_transport() if (found := _remote_questions(m)[0])}
    assert not hits, hits


def test_only_the_cluster_handle_and_named_modules_read_the_login_block() -> None:
    hits = {m: found for m in _outside_the_transport()
            if m not in LOGIN_READERS and (found := _remote_questions(m)[1])}
    assert not hits, hits


def test_every_login_reader_exemption_is_still_needed() -> None:
    stale = [m for m in LOGIN_READERS
             if not (ROOT / m).is_file() or not _remote_questions(m)[1]]
    assert not stale, stale


def test_the_seam_check_sees_what_it_forbids(tmp_path: Path) -> None:
    # The checks above read code, so they must catch the shapes they forbid.
    (tmp_path / "m.py").write_text(
        "from hpcdl.remote.ssh import SshExecutor\n"
        "def f(profile, conn):\n"
        "    if profile.login is None or isinstance(conn.executor, SshExecutor):\n"
        "        return conn.ssh\n")
    ssh, login = _remote_questions("m.py", tmp_path)
    assert sorted(ssh) == ["1: imports hpcdl.remote.ssh",
                           "3: asks a transport's type (isinstance(conn.executor, SshExecutor))",
                           "3: names SshExecutor"]
    assert login == ["3: reads profile.login", "4: reads conn.ssh"]
