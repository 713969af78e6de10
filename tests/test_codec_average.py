"""The fast member encoder (`codec_average.encode`) against its definition (`encode_definition`, float64 through
`codec.quantize`): the same exponent and the same int32 elements, bit for bit, on random and adversarial
vectors, at every bound and fan-in that matters."""

import inspect
import math
import textwrap

import numpy as np
import pytest

from inwire.codec import choose_exponent
from inwire.protocol import INT32_MAX
from inwire.train import codec_average
from inwire.train.codec_average import encode, encode_definition


def adversarial(bound, fanin, rng):
    """Values at and around the limit, half-way ties, signed zeros, the smallest normals and subnormals,
    and random ones at several scales."""
    exponent = choose_exponent(bound, fanin)
    limit = math.ldexp(INT32_MAX, exponent)
    step = math.ldexp(1.0, exponent)
    edges = [0.0, -0.0, limit, -limit, np.nextafter(np.float32(limit), np.float32(0)), step / 2, -step / 2,
             1.5 * step, 2.5 * step, -2.5 * step, np.finfo(np.float32).tiny, np.finfo(np.float32).smallest_subnormal,
             -np.finfo(np.float32).smallest_subnormal, bound, -bound]
    scales = [bound, bound / 1e3, step * 3]
    random = np.concatenate([rng.uniform(-s, s, 500) for s in scales])
    values = np.concatenate([np.array(edges, dtype=np.float64), random]).astype(np.float32)
    return values[np.abs(values.astype(np.float64)) <= limit]


@pytest.mark.parametrize("bound", [16.0, 1.0, 1e-3, 2.0**-100, 3e6, 2.0**90])
@pytest.mark.parametrize("fanin", [1, 2, 3, 9, 64])
def test_the_fast_encoder_equals_its_definition(bound, fanin):
    rng = np.random.default_rng([int(math.log2(bound) + 200), fanin])
    values = adversarial(bound, fanin, rng)
    fast, definition = encode(values, bound, fanin), encode_definition(values, bound, fanin)
    assert fast[0] == definition[0]
    assert fast[1].dtype == definition[1].dtype == np.int32
    assert np.array_equal(fast[1], definition[1])


def test_values_that_do_not_fit_take_the_definition_and_say_how_far():
    values = np.array([1.0, -5000.0, 3.0], dtype=np.float32)
    fast, definition = encode(values, 1.0, 3), encode_definition(values, 1.0, 3)
    assert fast[0] == definition[0] and np.array_equal(fast[1], definition[1]) and fast[1][-1] > 0


def test_an_empty_vector_and_bad_values():
    assert np.array_equal(encode(np.zeros(0, np.float32), 16.0, 2)[1], encode_definition(np.zeros(0), 16.0, 2)[1])
    for bad in (np.nan, np.inf, -np.inf):
        with pytest.raises(ValueError, match="NaN or infinity"):
            encode(np.array([1.0, bad], dtype=np.float32), 16.0, 2)


@pytest.mark.parametrize("original, replacement, beyond", [
    ("    np.rint(scaled, out=scaled)\n", "", 0.0),
    ("values * factor if", "values.astype(np.float16) * factor if", 0.0),
    ("> math.ldexp(INT32_MAX, exponent)", "> 2 * math.ldexp(INT32_MAX, exponent)", 1.5),
])
def test_a_tampered_fast_encoder_is_caught(original, replacement, beyond):
    """The comparison sees a fast encoder that truncates instead of rounding, scales in float16, or keeps
    values beyond the limit on the fast path."""
    source = textwrap.dedent(inspect.getsource(codec_average.encode))
    assert source.count(original) == 1, original
    namespace = {}
    exec(compile(source.replace(original, replacement), codec_average.__file__, "exec"), vars(codec_average),
         namespace)
    tampered = namespace["encode"]
    rng = np.random.default_rng(1)
    values = adversarial(16.0, 3, rng)
    if beyond:
        values = np.append(values, np.float32(beyond * math.ldexp(INT32_MAX, choose_exponent(16.0, 3))))
    with np.errstate(invalid="ignore", over="ignore"):
        assert not np.array_equal(tampered(values, 16.0, 3)[1], encode_definition(values, 16.0, 3)[1])
