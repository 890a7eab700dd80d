"""trainkit.say writes a line in one call, so ranks sharing a pipe never split it."""

from __future__ import annotations

import io

from trainkit.say import say


class _Recorder(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.flushes = 0

    def write(self, text: str) -> int:
        self.calls.append(text)
        return super().write(text)

    def flush(self) -> None:
        self.flushes += 1


def test_one_write_per_line_then_flush():
    out = _Recorder()
    say("hpcdl_rank_checksum rank=1 host=n1 checksum=42edd9dff4eab35d", out)
    assert out.calls == ["hpcdl_rank_checksum rank=1 host=n1 checksum=42edd9dff4eab35d\n"]
    assert out.flushes == 1


def test_print_would_have_written_twice():
    # Why say() exists: print() hands the text and the newline over separately; with
    # PYTHONUNBUFFERED=1 each is its own write(2) on the shared pipe.
    out = _Recorder()
    print("line", file=out, flush=True)
    assert out.calls == ["line", "\n"]
