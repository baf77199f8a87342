"""The command line's shared value types: every bound holds, NaN and infinities never pass, and
the message names the value and what was expected."""

from __future__ import annotations

import argparse

import pytest

from tracker.arguments import MAX_BENCH_BATCH, batch_list, float_between, int_between, positive_float


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


def test_batch_list_is_bounded_by_the_largest_benchmark_batch():
    """Every benchmark's --batches: a batch is allocated whole, so 100000 asked for gigabytes."""
    assert batch_list(f"8,1,8,{MAX_BENCH_BATCH}") == [8, 1, MAX_BENCH_BATCH]
    for text in ["0", f"1,{MAX_BENCH_BATCH + 1}", "100000", "1,,2", "x", ""]:
        with pytest.raises(argparse.ArgumentTypeError) as refused:
            batch_list(text)
        assert str(refused.value) == (f"bad value {text!r}; expected comma-separated batch sizes from 1 to "
                                      f"{MAX_BENCH_BATCH}, e.g. 1,2,4,8")
