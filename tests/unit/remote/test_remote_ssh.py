"""hpcdl.remote.ssh's pure parts: argv, quoting, error wording, rsync's figures.
(tests/integration/test_remote_ssh.py runs it against a real sshd.)"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from hpcdl.errors import UserInputError
from hpcdl.remote.ssh import (
    LoginNode,
    RemoteError,
    SshExecutor,
    _ssh_said,
    connection_error,
    remote_command,
    rsync_bytes,
)
from hpcdl.schedulers.executor import Executor

SOCKETS = Path("/run/user/1000/hpcdl/ssh")


def test_the_argv_rides_the_master_connection_and_names_the_profiles_values():
    login = LoginNode("login.example.org", user="jdoe", port=2222, identity="/home/jdoe/.ssh/k",
                      jump="gw.example.org")
    argv = SshExecutor(login, SOCKETS).ssh_argv(["squeue", "--me", "-h"])
    assert argv[0] == "ssh" and argv[-3:] == ["login.example.org", "--", "squeue --me -h"]
    joined = " ".join(argv)
    for part in ("-o ControlMaster=auto", "-o BatchMode=yes",
                 "-l jdoe", "-p 2222", "-i /home/jdoe/.ssh/k", "-J gw.example.org"):
        assert part in joined
    # One master per login node and key: another key never rides on this connection.
    path = next(a for a in argv if a.startswith("ControlPath="))
    other = SshExecutor(LoginNode("login.example.org", user="jdoe", port=2222,
                                  identity="/home/jdoe/.ssh/other", jump="gw.example.org"),
                        SOCKETS).ssh_argv(["true"])
    assert re.fullmatch(rf"ControlPath={SOCKETS}/[0-9a-f]{{16}}", path)
    assert path not in other
    # An alias alone: ~/.ssh/config supplies the rest.
    bare = SshExecutor(LoginNode("mycluster"), SOCKETS).ssh_argv(["true"])
    assert not {"-l", "-p", "-i", "-J"} & set(bare)


def test_remote_words_are_quoted_for_the_remote_shell():
    argv = ["sbatch", "--job-name", "a b", "$(reboot)", "x;y", "it's"]
    assert shlex.split(remote_command(argv)) == argv
    with pytest.raises(ValueError):
        remote_command([])


@pytest.mark.parametrize("field, value", [("host", "-oProxyCommand=sh"), ("host", "a b"),
                                          ("host", "h\nx"), ("user", "-l"), ("jump", "-J x"),
                                          ("identity", "relative/key")])
def test_a_value_ssh_would_read_as_an_option_is_refused(field, value):
    with pytest.raises(ValueError):
        LoginNode(**{"host": "login", field: value})


def test_port_range():
    with pytest.raises(ValueError, match="port 70000"):
        LoginNode("login", port=70000)


def test_connection_errors_say_which_and_how_to_fix_in_one_line():
    login = LoginNode("login.example.org", user="jdoe", port=2222)
    unknown = connection_error(login, "ssh: Could not resolve hostname login.example.org: "
                                      "Name or service not known\r\n")
    assert isinstance(unknown, UserInputError) and unknown.exit_code == 2
    assert unknown.message.startswith("login node jdoe@login.example.org port 2222: unknown host")
    refused = connection_error(login, "jdoe@login.example.org: Permission denied "
                                      "(publickey,gssapi-keyex).\n")
    assert refused.exit_code == 2 and "authentication refused" in refused.message
    down = connection_error(login, "ssh: connect to host login.example.org port 2222: "
                                   "Connection refused\n")
    assert isinstance(down, RemoteError) and down.exit_code == 1
    assert ": unreachable (ssh: connect to host" in down.message
    for err in (unknown, refused, down):
        assert "\n" not in err.message and "\r" not in err.message


def test_rsync_bytes_reads_the_stats():
    stats = ("Number of files: 3\nTotal bytes sent: 1,234,567\n"
             "Total bytes received: 89\n\nsent 1,234,567 bytes\n")
    assert rsync_bytes(stats) == 1234567
    assert rsync_bytes(stats, received=True) == 89
    assert rsync_bytes("nothing") == 0


def test_the_ssh_executor_is_an_executor_the_adapters_take():
    ex: Executor = SshExecutor(LoginNode("login"), SOCKETS)  # mypy checks the protocol
    assert callable(ex.run) and callable(ex.which)


def test_linking_from_a_sibling_compares_contents_not_size_and_time():
    ex = SshExecutor(LoginNode("login.example.org"), SOCKETS)
    linked = ex.rsync_argv("/l/run/", ":/r/run/", link_dest=["../older"])
    assert "--checksum" in linked and "--link-dest=../older" in linked
    assert "--checksum" not in ex.rsync_argv("/l/run/", ":/r/run/")


# What OpenSSH 9.2p1 (Debian 12) printed, captured against an sshd on loopback with an
# empty known_hosts (BatchMode yes and no: no terminal to ask on), with
# StrictHostKeyChecking=yes, and with another key recorded for the host.
UNKNOWN_KEY = "Host key verification failed.\r\n"
UNKNOWN_KEY_STRICT = ("No ED25519 host key is known for [127.0.0.1]:22999 and you have "
                      "requested strict checking.\r\nHost key verification failed.\r\n")
CHANGED_KEY = """\
@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\r
@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\r
@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\r
IT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!\r
Someone could be eavesdropping on you right now (man-in-the-middle attack)!\r
It is also possible that a host key has just been changed.\r
The fingerprint for the ED25519 key sent by the remote host is
SHA256:P679F0yIfkAcgjf8+mue5CLDGYFqQUja+JB3ZDd167k.\r
Please contact your system administrator.\r
Add correct host key in /home/jdoe/.ssh/known_hosts to get rid of this message.\r
Offending ED25519 key in /home/jdoe/.ssh/known_hosts:7\r
  remove with:\r
  ssh-keygen -f "/home/jdoe/.ssh/known_hosts" -R "[login.example.org]:2222"\r
Host key for [login.example.org]:2222 has changed and you have requested strict checking.\r
Host key verification failed.\r
"""


@pytest.mark.parametrize("stderr", [UNKNOWN_KEY, UNKNOWN_KEY_STRICT], ids=["ask", "strict"])
def test_a_host_key_not_yet_accepted_is_named_with_how_to_accept_it(stderr):
    login = LoginNode("login.example.org", user="jdoe", port=2222)
    err = connection_error(login, stderr)
    assert _ssh_said(stderr), "run() must see ssh's own failure, not the remote command's"
    assert isinstance(err, UserInputError) and err.exit_code == 2
    assert err.message.startswith("login node jdoe@login.example.org port 2222: its host key "
                                  "is not in ~/.ssh/known_hosts yet (")
    assert "authentication refused" not in err.message and "authorized_keys" not in err.message
    assert "check its fingerprint with the site" in err.message
    assert "connecting in a terminal: ssh -p 2222 jdoe@login.example.org" in err.message
    assert "ssh-keyscan -p 2222 login.example.org >> ~/.ssh/known_hosts" in err.message
    assert "\n" not in err.message and "\r" not in err.message


def test_through_a_jump_host_the_key_is_accepted_by_one_ssh_through_it():
    err = connection_error(LoginNode("login", jump="jdoe@gw.example.org"), UNKNOWN_KEY)
    assert err.message.endswith("connecting in a terminal: ssh -J jdoe@gw.example.org login")
    assert "ssh-keyscan" not in err.message  # it cannot go through the jump host


def test_a_changed_host_key_is_named_as_such_never_as_a_key_to_accept_blindly():
    login = LoginNode("login.example.org", user="jdoe", port=2222)
    err = connection_error(login, CHANGED_KEY)
    assert _ssh_said(CHANGED_KEY)
    assert isinstance(err, UserInputError) and err.exit_code == 2
    assert err.message.startswith(
        "login node jdoe@login.example.org port 2222: its host key has CHANGED from the one "
        "recorded in /home/jdoe/.ssh/known_hosts line 7 (ssh: REMOTE HOST IDENTIFICATION HAS "
        "CHANGED; it now sends SHA256:P679F0yIfkAcgjf8+mue5CLDGYFqQUja+JB3ZDd167k); this can "
        "be an attack: ask the site")
    assert ("ssh-keygen -R '[login.example.org]:2222' -f /home/jdoe/.ssh/known_hosts"
            in err.message)
    assert "ssh-keyscan" not in err.message and "not in ~/.ssh/known_hosts" not in err.message
    assert "@@@" not in err.message and "\n" not in err.message and "\r" not in err.message
