"""hpcdl.core.proc.stream with real processes: lines arrive as printed, failures carry the
tail, and an interrupted run leaves nothing behind, not even the child's own children.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from hpcdl.core import proc
from hpcdl.errors import ToolError


def test_stream_hands_over_lines_and_raises_with_the_tail() -> None:
    seen: list[str] = []
    res = proc.stream(["bash", "-c", "echo one; echo two >&2"], on_line=seen.append)
    assert seen == ["one\n", "two\n"] and res.returncode == 0
    with pytest.raises(ToolError) as err:
        proc.stream(["bash", "-c", "echo last words; exit 3"])
    assert err.value.returncode == 3 and "last words" in err.value.message


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it has stopped running all the same.
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_interrupted_stream_kills_the_whole_process_group() -> None:
    # The child starts a background grandchild that keeps running on its own; when the
    # caller is interrupted (here: its line callback raises) both must be gone.
    pids: list[int] = []

    def on_line(line: str) -> None:
        pids.append(int(line))
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        proc.stream(["bash", "-c", "sleep 300 & echo $!; wait"], on_line=on_line)
    deadline = time.monotonic() + 5
    while _alive(pids[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pids[0]), "the background sleep outlived the interrupted stream"
