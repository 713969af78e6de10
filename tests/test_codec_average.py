"""The fast member encoder (`codec_average.encode`) against its definition (`encode_definition`, float64 through
`codec.quantize`): the same exponent and the same int32 elements, bit for bit, on random and adversarial
vectors, at every bound and fan-in that matters; and the fast decoder (`decode`) against its definition
(`decode_definition`, through `codec.dequantize`): the same float32 average, bit for bit, at every exponent
and fan-in that matters. Each comparison runs both ways of computing: the compiled kernel (`inwire._kernel`,
as the client runs) and numpy (where it is not built); under CI=true a missing kernel fails."""

import inspect
import math
import os
import textwrap

import numpy as np
import pytest

from inwire import codec_average
from inwire.codec import EXPONENT_MAX, EXPONENT_MIN, choose_exponent
from inwire.codec_average import Pieces, decode, decode_definition, encode, encode_definition
from inwire.protocol import INT32_MAX


def require_compiled():
    if codec_average.compiled is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the compiled kernel inwire._kernel is not built (make setup builds it)")
        pytest.skip("the compiled kernel inwire._kernel is not built")


@pytest.fixture(params=["c", "numpy"])
def backend(request, monkeypatch):
    if request.param == "numpy":
        monkeypatch.setattr(codec_average, "compiled", None)
    else:
        require_compiled()
    return request.param


@pytest.fixture
def numpy_only(monkeypatch):
    """The numpy path, whose source the tamper tests edit."""
    monkeypatch.setattr(codec_average, "compiled", None)


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
def test_the_fast_encoder_equals_its_definition(bound, fanin, monkeypatch, backend):
    """In either byte order, across blocks (a block of 500 here, so that blocks and a short last one are
    crossed)."""
    monkeypatch.setattr(codec_average, "ENCODE_BLOCK", 500)
    rng = np.random.default_rng([int(math.log2(bound) + 200), fanin])
    values = adversarial(bound, fanin, rng)
    definition = encode_definition(values, bound, fanin)
    assert definition[1].dtype == np.int32
    for dtype in (np.dtype(np.int32), np.dtype(">i4")):
        fast = encode(values, bound, fanin, dtype)
        assert fast[0] == definition[0]
        assert fast[1].dtype == dtype
        assert np.array_equal(fast[1], definition[1])


def test_values_that_do_not_fit_take_the_definition_and_say_how_far(backend):
    values = np.array([1.0, -5000.0, 3.0], dtype=np.float32)
    definition = encode_definition(values, 1.0, 3)
    for dtype in (np.dtype(np.int32), np.dtype(">i4")):
        fast = encode(values, 1.0, 3, dtype)
        assert fast[0] == definition[0] and np.array_equal(fast[1], definition[1]) and fast[1][-1] > 0
        assert fast[1].dtype == dtype


@pytest.mark.parametrize("beyond", [0.0, 1.5], ids=["fitting", "beyond the limit"])
def test_pieces_encode_as_their_whole_vector_into_a_given_buffer(backend, beyond):
    """A vector given as pieces of several sizes (an empty one among them), quantized piece by piece into an
    `out` buffer that held other elements, encodes to the definition's elements of the whole vector, also
    when a value lies beyond the limit (the clipped definition and its doublings)."""
    rng = np.random.default_rng(4)
    values = adversarial(16.0, 3, rng)
    if beyond:
        values = np.append(values, np.float32(-beyond * math.ldexp(INT32_MAX, choose_exponent(16.0, 3))))
    cuts = [0, 1, 1, 100, len(values) // 2, len(values)]
    pieces = Pieces(len(values), lambda: (values[low:high] for low, high in zip(cuts, cuts[1:])))
    definition = encode_definition(values, 16.0, 3)
    for dtype in (np.dtype(np.int32), np.dtype(">i4")):
        out = np.full(len(values) + 1, 7, dtype=dtype)
        exponent, elements = encode(pieces, 16.0, 3, dtype, out=out)
        assert elements is out and exponent == definition[0] and np.array_equal(elements, definition[1])
        assert (elements[-1] > 0) == bool(beyond)


def test_pieces_that_do_not_add_up_and_a_wrong_buffer_are_refused(backend):
    short = Pieces(5, lambda: (np.ones(2, np.float32), np.ones(2, np.float32)))
    long = Pieces(3, lambda: (np.ones(2, np.float32), np.ones(2, np.float32)))
    for pieces in (short, long):
        with pytest.raises(ValueError, match=f"other than the {pieces.count} elements"):
            encode(pieces, 16.0, 2)
    with pytest.raises(ValueError, match="out must be 4 int32"):
        encode(np.ones(3, np.float32), 16.0, 2, out=np.empty(3, np.int32))


def test_an_empty_vector_and_bad_values(backend):
    assert np.array_equal(encode(np.zeros(0, np.float32), 16.0, 2)[1], encode_definition(np.zeros(0), 16.0, 2)[1])
    for bad in (np.nan, np.inf, -np.inf):
        with pytest.raises(ValueError, match="NaN or infinity"):
            encode(np.array([1.0, bad], dtype=np.float32), 16.0, 2)


@pytest.mark.parametrize("original, replacement, beyond", [
    ("            np.rint(scaled, out=scaled)\n", "", 0.0),
    ("np.multiply(block, factor", "np.multiply(block.astype(np.float16), factor", 0.0),
    ("if peak > math.ldexp(INT32_MAX, exponent)", "if peak > 2 * math.ldexp(INT32_MAX, exponent)", 1.5),
])
def test_a_tampered_fast_encoder_is_caught(original, replacement, beyond, numpy_only):
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


@pytest.mark.parametrize("original, replacement, beyond", [
    ("math.ldexp(1.0, -exponent), place", "math.ldexp(1.0, 1 - exponent), place", 0.0),
    ("_big_endian(dtype))", "not _big_endian(dtype))", 0.0),
    ("if peak > math.ldexp(INT32_MAX, exponent)", "if peak > 2 * math.ldexp(INT32_MAX, exponent)", 1.5),
])
def test_a_tampered_compiled_encoder_is_caught(original, replacement, beyond):
    """The same comparison sees the compiled path scale by the wrong power of two, write the wrong byte order,
    or keep clamped elements of values beyond the limit."""
    require_compiled()
    source = textwrap.dedent(inspect.getsource(codec_average.encode))
    assert source.count(original) == 1, original
    namespace = {}
    exec(compile(source.replace(original, replacement), codec_average.__file__, "exec"), vars(codec_average),
         namespace)
    values = adversarial(16.0, 3, np.random.default_rng(1))
    if beyond:
        values = np.append(values, np.float32(beyond * math.ldexp(INT32_MAX, choose_exponent(16.0, 3))))
    assert not np.array_equal(namespace["encode"](values, 16.0, 3, np.dtype(">i4"))[1],
                              encode_definition(values, 16.0, 3)[1])


def adversarial_sums(rng, length=3000):
    """int32 sums at and around the limits, zero, ones, powers of two and their neighbours, and random ones,
    ending with a zero doublings element."""
    edges = [0, 1, -1, 2, -2, 3, -3, INT32_MAX, -INT32_MAX, -INT32_MAX - 1, INT32_MAX - 1]
    edges += [sign * (1 << k) + d for k in range(31) for d in (-1, 0, 1) for sign in (1, -1)]
    sums = np.concatenate([np.array(edges, dtype=np.int64), rng.integers(-2**31, 2**31, length)])
    return np.append(np.clip(sums, -INT32_MAX - 1, INT32_MAX).astype(np.int32), np.int32(0))


@pytest.mark.parametrize("exponent", [EXPONENT_MIN, -127, -100, -31, -20, -1, 0, 1, 30, 96, EXPONENT_MAX])
@pytest.mark.parametrize("fanin", [1, 2, 3, 7, 9, 64])
def test_the_fast_decoder_equals_its_definition(exponent, fanin, monkeypatch, backend):
    """Bit for bit, from native and big-endian int32 sums (as the client reads them off the wire) and int64
    ones (the in-process aggregate), across blocks (a block of 1000 here, so that blocks and a short last one
    are crossed)."""
    monkeypatch.setattr(codec_average, "DECODE_BLOCK", 1000)
    sums = adversarial_sums(np.random.default_rng([exponent + 200, fanin]))
    for given in (sums, sums.astype(">i4"), sums.astype(np.int64), sums[:1], sums[-1001:]):
        with np.errstate(over="ignore"):  # the largest sums at the largest exponents are infinite, in both
            fast, fast_bound = decode(given, False, exponent, fanin, 16.0)
            expected, bound = decode_definition(given, False, exponent, fanin, 16.0)
        assert fast_bound == bound == 16.0 and fast.dtype == expected.dtype == np.float32
        assert np.array_equal(fast.view(np.int32), expected.view(np.int32))
    # In place, as the client decodes: the average written over the big-endian sums it is read from.
    wire = sums.astype(">i4")
    with np.errstate(over="ignore"):
        expected, _ = decode_definition(wire.copy(), False, exponent, fanin, 16.0)
        in_place, _ = decode(wire, False, exponent, fanin, 16.0, out=wire.view(np.float32)[:-1])
    assert np.shares_memory(in_place, wire) and np.array_equal(in_place.view(np.int32), expected.view(np.int32))


def test_the_fast_decoder_asks_for_the_same_bound_and_refuses_the_same_inputs(backend):
    sums = adversarial_sums(np.random.default_rng(3), 10)
    for overflow, doublings in ((True, 0), (False, 3), (True, 2)):
        sums[-1] = doublings
        assert decode(sums, overflow, -20, 3, 16.0) == decode_definition(sums, overflow, -20, 3, 16.0) == (
            None, 16.0 * 2 ** max(1, doublings))
    sums[-1] = 0
    for exponent, fanin, error in ((200, 3, ValueError), (-20, 0, ValueError), (1.5, 3, TypeError)):
        with pytest.raises(error):
            decode_definition(sums, False, exponent, fanin, 16.0)
        with pytest.raises(error):
            decode(sums, False, exponent, fanin, 16.0)
    with pytest.raises(TypeError):
        decode(sums.astype(np.float64), False, -20, 3, 16.0)


@pytest.mark.parametrize("original, replacement", [
    ("dtype=np.float64)", "dtype=np.float32)"),
    ("        np.divide(block, fanin, out=block)\n", ""),
    ("last = min(first + DECODE_BLOCK, elements)", "last = min(first + DECODE_BLOCK, elements - 1)"),
])
def test_a_tampered_fast_decoder_is_caught(original, replacement, numpy_only):
    """The comparison sees a fast decoder that works in float32, forgets the fan-in, or leaves the last
    element out."""
    source = textwrap.dedent(inspect.getsource(codec_average.decode))
    assert source.count(original) == 1, original
    namespace = {}
    exec(compile(source.replace(original, replacement), codec_average.__file__, "exec"), vars(codec_average),
         namespace)
    tampered = namespace["decode"]
    sums = adversarial_sums(np.random.default_rng(2))
    caught = False
    for exponent in (-128, -20, 0):
        for fanin in (3, 9):
            got = tampered(sums, False, exponent, fanin, 16.0)[0]
            caught |= not np.array_equal(got.view(np.int32),
                                         decode_definition(sums, False, exponent, fanin, 16.0)[0].view(np.int32))
    assert caught


def test_the_overflow_flag_stays_set_after_a_later_contribution_brings_the_sum_back():
    """The aggregator's sum saturates as the second member arrives and no longer at the third, whose
    contribution brings it back in range: the sum is clipped at each arrival (2**31 - 1, then 0) and the
    overflow flag, like the golden model's slot flag, stays set, so the members re-send at a raised bound."""
    members = [np.array([INT32_MAX, 5]), np.array([INT32_MAX, 5]), np.array([-INT32_MAX, 5])]
    sums, overflow = codec_average.aggregate(members)
    assert sums.tolist() == [0, 15] and overflow is True
