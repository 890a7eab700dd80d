"""hpcdl/core/yamlmodel.py: every problem with a typed YAML file is one ConfigError line
naming the file and the line (syntax) or the field (schema), on real files and a small
model of its own."""

from __future__ import annotations

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcdl.core.yamlmodel import (
    describe_validation_error,
    load_yaml_model,
    parse_yaml_model,
    read_text,
)
from hpcdl.errors import ConfigError


class Inner(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    port: int
    host: str = "h"


class Outer(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    name: str
    inner: Inner | None = None
    items: list[Inner] = []
    env: dict[str, int] = {}


def parse(text: str) -> Outer:
    return parse_yaml_model(text, Outer, source="f.yaml", kind="spec")


def message(text: str) -> str:
    with pytest.raises(ConfigError) as err:
        parse(text)
    assert "\n" not in err.value.message
    return err.value.message


def test_a_valid_file_is_the_model():
    got = parse("name: x\ninner: {port: 2}\nitems: [{port: 3, host: a}]\nenv: {A: 1}\n")
    assert got == Outer(name="x", inner=Inner(port=2), items=[Inner(port=3, host="a")],
                        env={"A": 1})


@pytest.mark.parametrize(("text", "want"), [
    ("name: [x\n", "f.yaml:2:1: YAML syntax error: expected ',' or ']', but got '<stream end>'"),
    ("name: x\n  bad: : y\n", "f.yaml:2:"),
    ("- a\n- b\n", "f.yaml: a spec must be a YAML mapping, got list"),
    ("", "f.yaml: a spec must be a YAML mapping, got NoneType"),
    pytest.param("[" * 50000, "f.yaml: YAML nested too deeply to be a spec", id="deep"),
    ("nam: x\n", "f.yaml: unknown key 'nam' (valid keys here: env, inner, items, name)"),
    ("name: x\ninner: {port: 1, hots: a}\n",
     "f.yaml: unknown key 'inner.hots' (valid keys here: host, port)"),
    ("name: x\nitems: [{port: 1}, {prt: 2}]\n",
     "f.yaml: unknown key 'items[1].prt' (valid keys here: host, port)"),
    ("name: x\ninner: {}\n", "f.yaml: field 'inner.port' is required"),
    ("name: x\ninner: {port: many}\n", "f.yaml: field 'inner.port': Input should be a valid integer"),
    ("name: x\nenv: {'a b': x}\n", "f.yaml: field 'env['a b']': Input should be a valid integer"),
    ("name: {a: 1}\n", "f.yaml: field 'name': Input should be a valid string"),
])
def test_each_problem_is_one_line_naming_where(text, want):
    got = message(text)
    assert got.startswith(want.rstrip()) or want in got, got


def test_a_value_is_shown_only_when_it_is_a_scalar():
    assert message("name: x\ninner: {port: many}\n").endswith("(got 'many')")
    assert "(got" not in message("name: [1, 2]\n")


def test_files_are_read_as_utf8_and_every_failure_names_the_file(tmp_path):
    good = tmp_path / "a.yaml"
    good.write_text("name: \u00e9\n", encoding="utf-8")
    assert load_yaml_model(good, Outer, kind="spec").name == "\u00e9"
    latin = tmp_path / "b.yaml"
    latin.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"b.yaml: spec is not UTF-8 text \(byte b'\\xe9' at offset 9\)"):
        read_text(latin, kind="spec")
    with pytest.raises(ConfigError, match=r"none.yaml: cannot read spec: No such file"):
        read_text(tmp_path / "none.yaml", kind="spec")
    with pytest.raises(ConfigError, match="is a directory, not a spec file"):
        read_text(tmp_path, kind="spec")


@given(st.dictionaries(st.text(min_size=1, max_size=10), st.integers(), max_size=3))
def test_any_unknown_key_is_named_on_one_line(extra):
    extra = {k: v for k, v in extra.items() if k not in Outer.model_fields}
    if not extra:
        return
    with pytest.raises(pydantic.ValidationError) as err:
        Outer.model_validate({"name": "x", **extra})
    line = describe_validation_error(err.value, Outer)
    assert line.startswith("unknown key ") and "\n" not in line
    assert line.endswith("(valid keys here: env, inner, items, name)")
