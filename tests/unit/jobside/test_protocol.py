"""hpcdl.jobside.protocol: the result line and the rank line, written and parsed by
one module (the examples print with it, hpcdl reads with it)."""

from __future__ import annotations

import ast
import socket
import sys
from pathlib import Path

import pytest

from hpcdl.jobs.logs import format_result_table
from hpcdl.jobside.protocol import (
    parse_rank_table,
    parse_result,
    rank_line,
    result_line,
    unlabel,
)

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def test_result_line_round_trips_under_every_launchers_prefix() -> None:
    result = {"world_size": 2, "images_per_sec": 12.5, "note": "a \"quoted\" word"}
    line = result_line(result)
    assert "\n" not in line
    for prefix in ("", "0: ", "  1: ", "[0]<stdout>:"):
        assert parse_result(f"epoch 1\n{prefix}{line}\n") == result
    # The last one wins; a broken one is skipped.
    assert parse_result(result_line({"a": 1}) + "\n" + result_line({"a": 2})) == {"a": 2}
    assert parse_result('{"hpcdl_result": {"a": \n') is None


def test_rank_line_round_trips_with_host_and_reads_old_lines_without() -> None:
    lines = [rank_line(1, "abc", host="n2"), rank_line(0, "abc")]
    rows = parse_rank_table("\n".join(f"{r}: {line}" for r, line in zip((1, 0), lines, strict=True)))
    assert rows == [{"rank": 0, "host": socket.gethostname(), "checksum": "abc"},
                    {"rank": 1, "host": "n2", "checksum": "abc"}]
    # mnist_small printed no host= before this module: its lines still make a table.
    old = parse_rank_table("0: hpcdl_rank_checksum rank=0 checksum=ff\n"
                           "1: hpcdl_rank_checksum rank=1 checksum=ff\n")
    assert old == [{"rank": 0, "host": None, "checksum": "ff"},
                   {"rank": 1, "host": None, "checksum": "ff"}]
    table = format_result_table({"world_size": 2}, old)
    assert "   0  -           ff" in table and "parameters identical on every rank" in table


def test_rank_line_refuses_values_that_would_not_parse_back() -> None:
    with pytest.raises(ValueError, match="host 'a b'"):
        rank_line(0, "abc", host="a b")
    with pytest.raises(ValueError, match="checksum"):
        rank_line(0, "")


def test_unlabel() -> None:
    assert unlabel("3: text") == (3, "text")
    assert unlabel("text: 3") == (None, "text: 3")


def _calls(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.func.id for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}


@pytest.mark.parametrize("example, needs", [
    ("mnist_small.py", {"rank_line", "result_line"}),
    ("resnet50_imagenet.py", {"rank_line", "result_line"}),
    ("synthetic_benchmark.py", {"result_line"}),
])
def test_the_examples_print_through_the_protocol(example: str, needs: set[str]) -> None:
    path = EXAMPLES / example
    assert needs <= _calls(path)
    text = path.read_text()
    assert "hpcdl_rank_checksum" not in text.replace('``hpcdl_rank_checksum', '')
    assert 'json.dumps({"hpcdl_result"' not in text


def test_protocol_is_stdlib_only() -> None:
    # The examples import it inside jobs (from the image's /opt/hpcdl) before anything else.
    source = (Path(__file__).resolve().parents[3] / "hpcdl" / "jobside" / "protocol.py")
    tree = ast.parse(source.read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)
