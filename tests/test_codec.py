"""Fixed-point codec: no k-way sum overflows, and the decoded average stays within the stated bound."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inwire.codec import average_error_bound, choose_exponent, dequantize, quantize
from inwire.protocol import INT32_MAX


@settings(max_examples=300, deadline=None)
@given(max_abs=st.floats(1e-30, 1e30), fanin=st.integers(1, 64))
def test_exponent_is_the_smallest_that_keeps_the_sum_in_int32(max_abs, fanin):
    exponent = choose_exponent(max_abs, fanin)
    assert fanin * (math.floor(math.ldexp(max_abs, -exponent)) + 1) <= INT32_MAX
    if exponent > -128:
        assert fanin * (math.floor(math.ldexp(max_abs, -(exponent - 1))) + 1) > INT32_MAX


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_the_exponent_leaves_room_for_rounding_up_at_the_bound(rounding):
    """Each member's value may round up by up to one unit: at exponent 0, 2**30 - 0.5 becomes 2**30, and two
    members' sum 2**31 would saturate though 2 * (2**30 - 0.5) fits int32. The exponent keeps that slack."""
    bound, fanin = 2**30 - 0.5, 2
    exponent = choose_exponent(bound, fanin)
    # Stochastic rounding rounds up half the time: with 64 elements some element rounds up in both members.
    values = np.resize([bound, -bound], 64)
    rng = np.random.default_rng(5)
    members = [quantize(values, exponent, rounding, rng=rng) for _ in range(fanin)]
    total = np.sum(members, axis=0, dtype=np.int64)
    assert np.abs(total).max() <= INT32_MAX, (exponent, total)


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("fanin", [1, 2, 3, 9, 64])
@pytest.mark.parametrize("scale", [1e-6, 1.0, 3e4])
def test_average_error_stays_within_the_bound(rounding, fanin, scale):
    rng = np.random.default_rng(fanin)
    vectors = (rng.standard_normal((fanin, 4096)) * scale).astype(np.float32)
    vectors[0, 0] = scale * 8
    max_abs = float(np.abs(vectors).max())
    exponent = choose_exponent(max_abs, fanin)
    quantized = [quantize(v, exponent, rounding, rng=rng) for v in vectors]
    total = np.sum(quantized, axis=0, dtype=np.int64)
    assert np.abs(total).max() <= INT32_MAX
    average = dequantize(total, exponent, fanin)
    exact = vectors.astype(np.float64).mean(axis=0)
    float32_rounding = np.abs(exact) * 2.0**-24 + 2.0**-149
    error = np.abs(average.astype(np.float64) - exact)
    assert np.all(error <= average_error_bound(exponent, rounding) + float32_rounding)
    assert average_error_bound(exponent, "nearest") < fanin * max_abs / (INT32_MAX - fanin)


def test_at_the_exponent_floor_the_bound_is_the_floor_step_not_the_relative_one():
    """Values so small that e is clamped at -128: the relative bound k*M/(2**31-1-k) no longer holds."""
    max_abs, fanin = 2.0**-120, 2
    exponent = choose_exponent(max_abs, fanin)
    assert exponent == -128
    assert average_error_bound(exponent, "nearest") == 2.0**-129 > fanin * max_abs / (INT32_MAX - fanin)


def test_nearest_rounding_is_deterministic_and_ties_to_even():
    values = np.array([0.5, 1.5, 2.5, -0.5, 0.25], dtype=np.float32)
    assert quantize(values, 0).tolist() == [0, 2, 2, 0, 0]
    assert quantize(values, -2).tolist() == [2, 6, 10, -2, 1]


def test_stochastic_rounding_is_unbiased_and_reproducible():
    values = np.full(200_000, 0.25, dtype=np.float32)
    first = quantize(values, 0, "stochastic", rng=np.random.default_rng(1))
    again = quantize(values, 0, "stochastic", rng=np.random.default_rng(1))
    assert np.array_equal(first, again)
    assert set(np.unique(first)) == {0, 1}
    assert abs(first.mean() - 0.25) < 0.005


@pytest.mark.parametrize("call, error", [
    (lambda: choose_exponent(float("nan"), 3), ValueError),
    (lambda: choose_exponent(-1.0, 3), ValueError),
    (lambda: choose_exponent(1.0, 0), ValueError),
    (lambda: choose_exponent(1.0, 2.0), TypeError),
    (lambda: choose_exponent(1e300, 64), ValueError),
    (lambda: quantize(np.array([1, 2]), 0), TypeError),
    (lambda: quantize(np.array([np.inf], dtype=np.float32), 0), ValueError),
    (lambda: quantize(np.array([1.0]), 300), ValueError),
    (lambda: quantize(np.array([1.0]), 0.5), TypeError),
    (lambda: quantize(np.array([1.0]), 0, "truncate"), ValueError),
    (lambda: quantize(np.array([1.0]), 0, "stochastic"), TypeError),
    (lambda: quantize(np.array([3e9]), 0), ValueError),
    (lambda: dequantize(np.array([1.0]), 0), TypeError),
    (lambda: dequantize(np.array([1]), 0, 0), ValueError),
    (lambda: average_error_bound(0, "up"), ValueError),
])
def test_bad_input_raises_a_clear_error(call, error):
    with pytest.raises(error):
        call()


def test_zero_vector_round_trips():
    exponent = choose_exponent(0.0, 5)
    assert dequantize(quantize(np.zeros(4, dtype=np.float32), exponent) * 5, exponent, 5).tolist() == [0.0] * 4
