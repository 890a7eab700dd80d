"""hpcdl.sweep.params: what a sweep point may carry into the job's command line (names
and values are checked tokens before they are quoted: the second wall) and how each
point changes the command. The bundled example's real option list is read once."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdl.errors import ValidationError
from hpcdl.sweep import params
from hpcdl.sweep.params import Point

KNOWN = params.example_options()


def test_the_examples_options_are_read_from_its_argparse_calls():
    assert {"lr", "epochs", "batch-size", "backend", "data"} <= KNOWN
    assert all(not name.startswith("-") for name in KNOWN)


@pytest.mark.parametrize("value", ["$(reboot)", "a b", "x;y", "'q'", "a,b", "`id`", "\n",
                                   "", "x" * 201, "é"])
def test_a_value_that_is_not_one_plain_token_is_refused(value):
    with pytest.raises(ValidationError, match=r"^param lr: value .* is not one plain token"):
        params.check_value("lr", value)


@pytest.mark.parametrize("value", ["0.1", "-1e-4", "+3", "resnet18", "/scratch/d", "a:b@c%d_e",
                                   "x" * 200])
def test_plain_tokens_pass(value):
    assert params.check_value("lr", value) == value


def test_names_are_plain_not_reserved_and_the_examples_own():
    assert params.check_name("lr", known=KNOWN) == "lr"
    assert params.check_name("anything_1", known=None) == "anything_1"  # a COMMAND's
    with pytest.raises(ValidationError, match=r"^param: name '1lr' is not a plain name"):
        params.check_name("1lr", known=None)
    with pytest.raises(ValidationError, match=r"^param: --backend is set by hpcdl"):
        params.check_name("backend", known=KNOWN)
    with pytest.raises(ValidationError, match=r"^param: 'nope' is not an option of the bundled"):
        params.check_name("nope", known=KNOWN)


def test_parse_param_drops_duplicates_and_refuses_empty_items():
    assert params.parse_param("--lr=0.1, 0.05,0.1", known=KNOWN) == ("lr", ("0.1", "0.05"))
    for text, why in [("lr", "is not NAME=v1,v2"), ("lr=", "empty list of values"),
                      ("lr=0.1,,0.2", "an empty value in")]:
        with pytest.raises(ValidationError, match=why):
            params.parse_param(text, known=KNOWN)


def test_the_grid_varies_the_last_parameter_fastest_and_has_a_ceiling():
    points = params.grid([("lr", ("0.1", "0.2")), ("wd", ("0", "1", "2"))])
    assert [p.describe() for p in points[:4]] == ["lr=0.1 wd=0", "lr=0.1 wd=1", "lr=0.1 wd=2",
                                                  "lr=0.2 wd=0"]
    assert [p.index for p in points] == list(range(6))
    with pytest.raises(ValidationError, match="'lr' given twice"):
        params.grid([("lr", ("1",)), ("lr", ("2",))])
    ten = tuple(str(i) for i in range(10))
    with pytest.raises(ValidationError, match=r"^param: the grid has 100000 points; at most 10000$"):
        params.grid([(f"p{i}", ten) for i in range(5)])


@pytest.mark.parametrize("text, why", [
    ("lr=log:0:1", "needs LOW > 0"), ("lr=lin:1:1", "LOW < HIGH"), ("lr=exp:1:2", "LOW < HIGH"),
    ("lr=lin:a:b", "is not log:LOW:HIGH"), ("lr=lin:0:inf", "LOW < HIGH"),
])
def test_a_range_is_refused_with_its_reason(text, why):
    with pytest.raises(ValidationError, match=why):
        params.parse_range(text)


def test_random_points_stay_inside_their_ranges_and_repeat_for_a_seed():
    drawn = params.sample(["lr=log:1e-4:1e-1", "wd=lin:0:1", "arch=a,b"], 50, 3, known=None)
    for point in drawn:
        values = point.params
        assert 1e-4 * 0.999 <= float(values["lr"]) <= 1e-1 * 1.001
        assert 0 <= float(values["wd"]) <= 1 and values["arch"] in ("a", "b")
        assert params.check_value("lr", values["lr"])  # "%.4g" is a plain token
    assert drawn == params.sample(["lr=log:1e-4:1e-1", "wd=lin:0:1", "arch=a,b"], 50, 3,
                                  known=None)
    with pytest.raises(ValidationError, match="between 1 and 10000"):
        params.sample(["lr=lin:0:1"], 0, 3, known=None)


def test_a_points_file_must_name_the_same_parameters_in_every_point(tmp_path: Path):
    good = tmp_path / "good.yaml"
    good.write_text("- {lr: 0.1, epochs: 2}\n- {epochs: 3, lr: 1e-3}\n")
    assert [p.params for p in params.load_points(good, known=KNOWN)] == [
        {"lr": "0.1", "epochs": "2"}, {"epochs": "3", "lr": "1e-3"}]  # YAML 1.1: a word
    for text, why in [("- {lr: 0.1}\n- {epochs: 2}\n", "point 1 names"),
                      ("- {lr: [1, 2]}\n", "point 0, lr: \\[1, 2\\] is not a number or a word"),
                      ("- {lr: true}\n", "is not a number or a word"),
                      ("{lr: 0.1}\n", "expected a non-empty list"), ("- 3\n", "point 0 is not a mapping")]:
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(ValidationError, match=why):
            params.load_points(bad, known=KNOWN)


def test_a_point_replaces_the_shared_example_args_it_sets():
    point = Point(0, (("lr", "0.5"), ("epochs", "2")))
    assert params.example_args(("--lr=0.1", "--batch-size=32", "--epochs"), point) == (
        "--batch-size=32", "--lr=0.5", "--epochs=2")


def test_a_point_fills_the_commands_placeholders_and_appends_the_rest():
    point = Point(0, (("lr", "0.5"), ("seed", "7")))
    assert params.command_args(("python3", "train.py", "--lr", "{lr}", "--out=run-{lr}"),
                               point) == ("python3", "train.py", "--lr", "0.5", "--out=run-0.5",
                                          "--seed=7")
