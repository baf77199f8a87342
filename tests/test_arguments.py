"""The command line's shared value types: every bound holds, NaN and infinities never pass, and
the message names the value and what was expected."""

from __future__ import annotations

import argparse

import pytest

from tracker.arguments import float_between, int_between, positive_float


@pytest.mark.parametrize("parse, good, bad, expected", [
    (float_between(0, 1), ["0", "1", "0.5", "1e-300"], ["-0.001", "1.0001", "nan", "inf", "x", ""], "a number >= 0 and <= 1"),
    (float_between(0, 3600, what="a number of seconds"), ["0", "3600"], ["-1", "3600.5", "inf", "nan", "1e400"],
     "a number of seconds >= 0 and <= 3600"),
    (positive_float, ["1e-300", "3e-3"], ["0", "-0", "-1", "inf", "nan"], "a number > 0"),
    (int_between(2, 5), ["2", "5"], ["1", "6", "2.5", "x"], "an integer from 2 to 5"),
])  # fmt: skip
def test_value_types(parse, good, bad, expected):
    for text in good:
        assert parse(text) == float(text)
    for text in bad:
        with pytest.raises(argparse.ArgumentTypeError) as refused:
            parse(text)
        assert str(refused.value) == f"bad value {text!r}; expected {expected}"
