"""Fixed-point codec: float vectors to the int32 elements the aggregator sums, and back.

A block of values x is sent as q = round(x / 2**e) with one block exponent e for the whole packet. All
members of a clique use the same e, picked from a bound M on |x| that they agree on, so that a k-way sum
of the q cannot leave int32: k * (floor(M / 2**e) + 1) <= 2**31 - 1 (the +1 covers either rounding).

Error bound (docs/protocol.md derives it): with the smallest such e, the average decoded from the sum
differs from the float64 average of the inputs by at most 2**(e-1) with round-to-nearest (below 2**e
with stochastic rounding), plus the float32 rounding of the result; 2**(e-1) < k*M / (2**31 - 1 - k)
except at the exponent's floor, where e = -128 whatever M.
"""

import math

import numpy as np

from .protocol import INT32_MAX

EXPONENT_MIN, EXPONENT_MAX = -128, 127
ROUNDINGS = ("nearest", "stochastic")


def choose_exponent(max_abs, fanin):
    """Smallest block exponent for which a `fanin`-way sum of values up to `max_abs` fits int32."""
    if isinstance(fanin, bool) or not isinstance(fanin, (int, np.integer)):
        raise TypeError(f"fanin must be an integer, got {fanin!r}")
    if not 1 <= fanin <= INT32_MAX // 2:
        raise ValueError(f"fanin must be a positive count, got {fanin}")
    max_abs = float(max_abs)
    if not math.isfinite(max_abs) or max_abs < 0:
        raise ValueError(f"max_abs must be a finite non-negative number, got {max_abs}")
    if max_abs == 0:
        return 0
    exponent = max(EXPONENT_MIN, math.frexp(max_abs * fanin / INT32_MAX)[1] - 1)
    while exponent > EXPONENT_MIN and _sum_fits(max_abs, fanin, exponent - 1):
        exponent -= 1
    while not _sum_fits(max_abs, fanin, exponent):
        exponent += 1
    if exponent > EXPONENT_MAX:
        raise ValueError(f"values up to {max_abs} cannot be summed {fanin} ways with an int8 exponent")
    return exponent


def _sum_fits(max_abs, fanin, exponent):
    return fanin * (math.floor(math.ldexp(max_abs, -exponent)) + 1) <= INT32_MAX


def quantize(values, exponent, rounding="nearest", rng=None):
    """int32 elements standing for `values` at block exponent `exponent`.

    Round-to-nearest (ties to even) is deterministic; "stochastic" rounds up with probability equal to
    the fraction, so the rounding is unbiased, and takes a numpy Generator `rng` for reproducibility.
    """
    values = np.asarray(values)
    if values.dtype.kind != "f":
        raise TypeError(f"values must be floating point, got {values.dtype}")
    _check_exponent(exponent)
    if not np.all(np.isfinite(values)):
        raise ValueError("values contain NaN or infinity")
    scaled = np.ldexp(values.astype(np.float64), -exponent)
    if rounding == "nearest":
        quantized = np.rint(scaled)
    elif rounding == "stochastic":
        if not isinstance(rng, np.random.Generator):
            raise TypeError("stochastic rounding needs rng, a numpy.random.Generator")
        quantized = np.floor(scaled + rng.random(scaled.shape))
    else:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    if quantized.size and (quantized.max() > INT32_MAX or quantized.min() < -INT32_MAX - 1):
        raise ValueError(f"values up to {np.abs(values).max()} do not fit int32 at exponent {exponent}")
    return quantized.astype(np.int32)


def dequantize(sums, exponent, fanin=1):
    """float32 average of `fanin` members from their int32 sum at block exponent `exponent`."""
    sums = np.asarray(sums)
    if sums.dtype.kind not in "iu":
        raise TypeError(f"sums must be integers, got {sums.dtype}")
    _check_exponent(exponent)
    if isinstance(fanin, bool) or not isinstance(fanin, (int, np.integer)) or fanin < 1:
        raise ValueError(f"fanin must be a positive integer, got {fanin!r}")
    # In place, one float64 temporary for a 100 MB vector; scaling by 2**exponent is exact in float64 over the
    # whole exponent range, so the product is ldexp's, at a multiply's speed.
    average = sums.astype(np.float64)
    np.multiply(average, math.ldexp(1.0, exponent), out=average)
    np.divide(average, fanin, out=average)
    return average.astype(np.float32)


def average_error_bound(exponent, rounding="nearest"):
    """Largest difference between a decoded average and the exact one, before float32 rounding."""
    _check_exponent(exponent)
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    return math.ldexp(1.0, exponent - 1 if rounding == "nearest" else exponent)


def _check_exponent(exponent):
    if isinstance(exponent, bool) or not isinstance(exponent, (int, np.integer)):
        raise TypeError(f"exponent must be an integer, got {exponent!r}")
    if not EXPONENT_MIN <= exponent <= EXPONENT_MAX:
        raise ValueError(f"exponent must lie in [{EXPONENT_MIN}, {EXPONENT_MAX}], got {exponent}")
