"""hpcdl/core/tokens.py: a value reaches a script only as one line of its kind
(re.fullmatch), and a request's refusal names the field, the value and the kind."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcdl.core.tokens import NAME, PATH, check_field, check_token
from hpcdl.errors import ValidationError


def test_a_token_of_its_kind_comes_back_as_it_is():
    assert check_token("gpu_a100", NAME) == "gpu_a100"
    assert check_token("/scratch/my data", PATH) == "/scratch/my data"


@pytest.mark.parametrize(("value", "kind", "why"), [
    ("gpu a100", NAME, "'gpu a100' is not a name, e.g. 'gpu_a100'"),
    ("gpu\n", NAME, "control character '\\n' (a value must be one line)"),
    ("/a\tb", PATH, "control character '\\t' (a value must be one line)"),
])
def test_a_value_not_of_its_kind_is_refused_naming_why(value, kind, why):
    with pytest.raises(ValueError) as err:
        check_token(value, kind)
    assert why in str(err.value)


def test_a_request_field_is_refused_in_one_line_naming_the_field():
    check_field("partition", "debug", NAME)  # nothing to say
    with pytest.raises(ValidationError) as err:
        check_field("partition", "de bug", NAME)
    assert err.value.message == "partition: 'de bug' is not a name, e.g. 'gpu_a100'"


@given(st.text(min_size=1, max_size=40))
def test_whatever_passes_is_one_line(value):
    try:
        check_field("data", value, PATH)
    except ValidationError as exc:
        assert exc.message.startswith("data: ") and "\n" not in exc.message
    else:
        assert not any(ord(c) < 0x20 or ord(c) == 0x7F for c in value)
