"""`hpcdl profiles detect --login` without a cluster: detection through a fake
Executor that records every argv and answers with outputs captured from the real
sandbox (tests/unit/slurm_outputs/sandbox/), and the profile's login: block.
tests/integration/test_remote_detect.py runs the same against the sandbox's login node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from hpcdl.cli import cli
from hpcdl.core import proc
from hpcdl.errors import ToolError, UserInputError
from hpcdl.profiles import load_profile_file
from hpcdl.profiles.schema import Login
from hpcdl.remote.ssh import (
    LoginNode,
    RemoteError,
    RemoteInputError,
    SshExecutor,
    connection_error,
)
from hpcdl.schedulers.slurm import detect as sd
from hpcdl.schedulers.slurm.describe import MODE_NOTE, describe

OUT = Path(__file__).resolve().parents[1] / "slurm_outputs" / "sandbox"
# What the login node answers, by the remote argv.
ANSWERS = {" ".join(argv): (OUT / f"{key}.txt").read_text() for key, argv in sd.COMMANDS.items()}
ANSWERS["/usr/bin/apptainer --version"] = (OUT / "apptainer-version.txt").read_text()
ON_PATH = {"scontrol": "/usr/bin/scontrol", "apptainer": "/usr/bin/apptainer"}


@dataclass
class FakeLogin:
    """An SshExecutor's surface (run, which, connect, login, where), recording what it is asked
    in order: ("connect",), ("run", argv...), ("which", name)."""

    login: LoginNode = LoginNode("login.example.org", user="jdoe")
    on_path: dict[str, str] = field(default_factory=lambda: dict(ON_PATH))
    refuse: Exception | None = None      # connect raises it
    failing: dict[str, Exception] = field(default_factory=dict)  # argv[0] -> run raises it
    asked: list[tuple[str, ...]] = field(default_factory=list)
    remote = True  # the transport facts an Executor has

    @property
    def target(self) -> str:
        return self.login.target

    @property
    def where(self) -> str:
        return f"login node {self.login.target}"

    def connect(self, *, timeout: float = 120) -> None:
        self.asked.append(("connect",))
        if self.refuse is not None:
            raise self.refuse

    def run(self, argv: Sequence[str], *, timeout: float, check: bool = True) -> proc.Result:
        self.asked.append(("run", *argv))
        if argv[0] in self.failing:
            raise self.failing[argv[0]]
        out = ANSWERS.get(" ".join(argv))
        if out is None:
            raise RemoteError(f"{argv[0]} on {self.login.target} failed (exit 127): "
                              f"sh: {argv[0]}: not found", argv=list(argv), returncode=127)
        return proc.Result(tuple(argv), 0, out, "")

    def which(self, name: str) -> str | None:
        self.asked.append(("which", name))
        return self.on_path.get(name)

    def which_all(self, names: Sequence[str]) -> dict[str, str | None]:
        return {name: self.which(name) for name in names}


@pytest.fixture
def no_local_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing may run on this machine: detection over a login node runs there only."""

    def refuse(argv: Sequence[str], **_kw: object) -> proc.Result:
        raise AssertionError(f"ran locally: {list(argv)}")

    monkeypatch.setattr(proc, "run", refuse)
    monkeypatch.setattr(proc, "which", lambda name: pytest.fail(f"looked up locally: {name}"))


def test_every_command_goes_through_the_login_node(no_local_commands: None) -> None:
    ex = FakeLogin()
    facts = sd.gather_remote(ex)  # type: ignore[arg-type]
    runs = [a[1:] for a in ex.asked if a[0] == "run"]
    assert ex.asked[0] == ("connect",), "the prompts (passphrase, 2FA) come first, once"
    assert ex.asked[1] == ("which", "scontrol")
    assert runs == [*sd.COMMANDS.values(), ("/usr/bin/apptainer", "--version")]
    assert [p.name for p in facts.partitions] == ["debug", "gpu", "short", "lowprio", "urgent"]
    assert facts.runtime == sd.Runtime("apptainer", "/usr/bin/apptainer", "1.4.5")
    assert facts.gaps == {}


def test_a_login_node_without_slurm_is_one_line_naming_it(no_local_commands: None) -> None:
    ex = FakeLogin(on_path={})
    with pytest.raises(RemoteInputError) as err:
        sd.gather_remote(ex)  # type: ignore[arg-type]
    assert err.value.exit_code == 2
    assert err.value.message == (
        "login node jdoe@login.example.org: Slurm's scontrol is not on the remote PATH "
        "(of a non-interactive ssh shell there); is it the cluster's login node?")
    assert ex.asked == [("connect",), ("which", "scontrol")], "nothing else was asked"


def test_a_refused_login_stops_detection_but_a_failing_command_is_a_gap() -> None:
    node = LoginNode("login.example.org", user="jdoe")
    refused = connection_error(node, "jdoe@login.example.org: Permission denied (publickey).")
    ex = FakeLogin(refuse=refused)
    with pytest.raises(UserInputError, match="authentication refused"):
        sd.gather_remote(ex)  # type: ignore[arg-type]
    assert ex.asked == [("connect",)]
    # A refusal in the middle (the key removed between commands) is not a gap either.
    ex = FakeLogin(failing={"sacctmgr": refused})
    with pytest.raises(UserInputError, match="authentication refused"):
        sd.gather_remote(ex)  # type: ignore[arg-type]
    lost = RemoteError("login node jdoe@login.example.org: unreachable (Connection reset)")
    facts = sd.gather_remote(FakeLogin(failing={"srun": lost}))  # type: ignore[arg-type]
    assert facts.mpi is None
    assert facts.gaps["mpi"] == "login node jdoe@login.example.org: unreachable (Connection reset)"


def test_unreadable_partitions_over_ssh_stop_after_one_command() -> None:
    ex = FakeLogin(failing={"scontrol": RemoteError(
        "scontrol on jdoe@login.example.org failed (exit 1): slurm_load_partitions error: "
        "Unable to contact slurm controller")})
    with pytest.raises(ToolError, match="cannot read the cluster: scontrol on jdoe@"):
        sd.gather_remote(ex)  # type: ignore[arg-type]
    assert [a for a in ex.asked if a[0] == "run"] == [("run", *sd.COMMANDS["partitions"])]


def test_the_profile_names_its_login_node_with_only_what_was_given() -> None:
    facts = sd.facts_from(sd.capture_all(executor=FakeLogin()))
    login = Login(host="login.example.org", port=2222, identity="/home/jdoe/.ssh/id_hpc")
    found = describe(facts, name="c", login=login)
    data = yaml.safe_load(found.text)
    assert data["login"] == {"host": "login.example.org", "port": 2222,
                             "identity": "/home/jdoe/.ssh/id_hpc"}
    assert found.profile.login == login
    assert list(data)[:3] == ["name", "description", "login"]
    assert "through login.example.org" in found.profile.description
    # The runtime found is the login node's; how the nodes run it is the user's to say.
    assert "(on the login node login.example.org)" in found.text
    assert MODE_NOTE in found.notes
    assert f"container:  # {MODE_NOTE}" in found.text
    assert "mode" not in data["container"]
    assert found.profile.container.mode == "auto"
    # Detected here (no login node): as before.
    local = describe(facts, name="c")
    assert "login" not in yaml.safe_load(local.text)
    assert local.profile.login is None
    assert MODE_NOTE not in local.notes and MODE_NOTE not in local.text
    assert "(on this node)" in local.text


def _detect(monkeypatch: pytest.MonkeyPatch, ex: FakeLogin, *args: str) -> tuple[int, str]:
    seen: list[LoginNode] = []

    def for_login(login: LoginNode) -> FakeLogin:
        seen.append(login)
        ex.login = login
        return ex

    monkeypatch.setattr(SshExecutor, "for_login", staticmethod(for_login))
    res = CliRunner().invoke(cli, ["profiles", "detect", *args])
    return res.exit_code, res.output


def test_cli_writes_the_login_block(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                    no_local_commands: None) -> None:
    key = tmp_path / "id_hpc"
    key.write_text("not a real key\n")
    out = tmp_path / "c.yaml"
    ex = FakeLogin()
    code, output = _detect(monkeypatch, ex, "--login", "jdoe@login.example.org", "--port",
                           "2222", "--identity", str(key), "--jump", "gw.example.org:2200",
                           "--name", "c", "-o", str(out))
    assert code == 0, output
    assert ex.login == LoginNode("login.example.org", user="jdoe", port=2222,
                                 identity=str(key), jump="gw.example.org:2200")
    prof = load_profile_file(out)
    assert prof.login == Login(host="login.example.org", user="jdoe", port=2222,
                               identity=str(key), jump="gw.example.org:2200")
    assert [p.name for p in prof.partitions] == ["debug", "gpu", "short", "lowprio", "urgent"]
    assert f"note: {MODE_NOTE}" in output
    assert ex.asked[0] == ("connect",)


def test_cli_unknown_host_is_one_line_exit_2(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                             no_local_commands: None) -> None:
    node = LoginNode("nosuchhost.invalid")
    out = tmp_path / "c.yaml"
    ex = FakeLogin(refuse=connection_error(node, "ssh: Could not resolve hostname "
                                                 "nosuchhost.invalid: Name or service not known"))
    code, output = _detect(monkeypatch, ex, "--login", "nosuchhost.invalid", "-o", str(out))
    assert code == 2
    assert output.splitlines()[0] == (
        "error: login node nosuchhost.invalid: unknown host (ssh: Could not resolve hostname "
        "nosuchhost.invalid: Name or service not known)")
    assert not out.exists()


@pytest.mark.parametrize("args, first_line", [
    (["--login", "-oProxyCommand=sh"],
     "error: --login: '-oProxyCommand=sh' is not a host name for ssh"),
    (["--login", "jdoe@"], "error: --login: '' is not a host name for ssh"),
    (["--login", "@login.example.org"], "error: --login: '' is not a user name"),
    (["--login", "a b@login.example.org"], "error: --login: 'a b' is not a user name"),
    (["--login", "h", "--jump", "gw;reboot"],
     "error: --jump: 'gw;reboot' is not a jump host list"),
    (["--login", "h", "--identity", "id_rsa"],
     "error: --identity: 'id_rsa' is not an absolute path"),
    (["--login", "h", "--identity", "/nonexistent/id_rsa"],
     "error: --identity: /nonexistent/id_rsa is not a file"),
    (["--port", "22"], "error: --port: only with --login [USER@]HOST"),
    (["--jump", "gw", "--identity", "/k"], "error: --identity, --jump: only with --login [USER@]HOST"),
])
def test_cli_refuses_bad_login_values_before_connecting(
        monkeypatch: pytest.MonkeyPatch, no_local_commands: None, args: list[str],
        first_line: str) -> None:
    ex = FakeLogin()
    code, output = _detect(monkeypatch, ex, *args)
    assert code == 2
    assert output.splitlines()[0].startswith(first_line), output
    assert ex.asked == []


def test_cli_port_out_of_range(monkeypatch: pytest.MonkeyPatch) -> None:
    code, output = _detect(monkeypatch, FakeLogin(), "--login", "h", "--port", "70000")
    assert code == 2
    assert "70000" in output and "1<=x<=65535" in output
