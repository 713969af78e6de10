"""One clique averaging as inwire computes it: members quantize at a shared exponent, the aggregator sums.

The member side (`encode`, `decode`) is what the member client sends and reads (`client.UdpMember.average`,
behind `train.averaging.InwireExchange`); `clique_average` puts the aggregator's sum (int32, saturating at
every contribution as the golden model and the gateware do) between them, so a study that simulates islands in
one process gets bit for bit the average the aggregator gives.
Numpy (and the compiled kernel `inwire._kernel`, _codec.c, where it is built) only: no torch.
"""

import math
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .codec import EXPONENT_MIN, choose_exponent, dequantize, quantize
from .errors import InwireError
from .kernel import compiled
from .protocol import ELEMENT_BYTES, INT32_MAX, INT32_MIN

ATTEMPTS = 7
"""The stride of protocol round numbers per averaging round: round r's attempt a is protocol round 7r + a. Odd,
so that a member's consecutive sums (round r and r + 1, attempts a and a + 1) fall in the two alternating round
pools of slots (`client.slot`) and the next one never claims the slots whose results a slower member of the last
one may still ask for; the one exception, rare, is the round after an odd number of re-sends (7r + 1, then
7r + 7)."""
AVERAGING_ATTEMPTS = ATTEMPTS - 1
"""Sums of one averaging (the first and its re-sends at a raised bound) before giving up: the last protocol round
of each stride, 7r + 6, is no averaging's, so that the next round's clique can agree there on what it averages
before its first sum (`client.agreement_round`)."""


class AveragingError(InwireError, RuntimeError):
    """An averaging round could not finish; the message says which and why. `missing`: the islands whose
    contributions never arrived, where that is known (`inwire.client.ClientError.missing`)."""

    def __init__(self, message: str, missing: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.missing = tuple(missing)


def encode_definition(values: npt.ArrayLike, bound: float, fanin: int) -> tuple[int, np.ndarray]:
    """(exponent, int32 elements) a member sends: its values at the exponent every member derives from
    `bound`, clipped to int32, and one extra element, the bound doublings it would need to fit unclipped.
    The definition, in float64 through `codec.quantize`; `encode` computes the same faster."""
    values = np.asarray(values, dtype=np.float32)
    peak = float(np.abs(values).max(initial=0.0))
    exponent = choose_exponent(bound, fanin)
    limit = math.ldexp(INT32_MAX, exponent)
    need = 0 if peak <= limit else math.ceil(math.log2(peak / limit))
    clipped = np.clip(values.astype(np.float64), -limit, limit)
    return exponent, np.append(quantize(clipped, exponent), np.int32(need))


def _big_endian(dtype: np.dtype) -> bool:
    """Whether an int32 dtype's bytes are big-endian (for the compiled kernel, which takes a flag)."""
    return dtype.byteorder == ">" or (dtype.byteorder == "=" and sys.byteorder == "big")


ENCODE_BLOCK = 1 << 16
"""Elements `encode` scales at a time: its float32 temporary (256 KiB) stays in cache."""


@dataclass(frozen=True)
class Pieces:
    """A float32 vector of `count` elements given as consecutive pieces (a model's parameters): `make()`
    yields them in order, each a float32 array of one dimension, made when it is asked for, as often as
    `encode` asks (a re-send reads them again). `encode` quantizes each into its place in the elements: no
    copy of the whole vector is ever made."""

    count: int
    make: Callable[[], Iterable[np.ndarray]]

    @classmethod
    def of(cls, values: np.ndarray) -> "Pieces":
        """One float32 vector as its only piece."""
        return cls(len(values), lambda: (values,))

    def __len__(self) -> int:
        return self.count

    def __array__(self, dtype: npt.DTypeLike | None = None, copy: bool | None = None) -> np.ndarray:
        """The whole vector, made (a copy of every piece): for code that takes a plain vector."""
        if copy is False:
            raise ValueError("pieces become one vector only as a copy")
        whole = np.empty(self.count, dtype=np.float32)
        for first, piece in self.placed():
            whole[first:first + len(piece)] = piece
        return whole if dtype is None else whole.astype(dtype, copy=False)

    def placed(self) -> Iterator[tuple[int, np.ndarray]]:
        """(first element, piece as contiguous float32) of each piece; ValueError if they do not add up to
        `count`."""
        first = 0
        for piece in self.make():
            piece = np.ascontiguousarray(piece, dtype=np.float32).reshape(-1)
            if first + len(piece) > self.count:
                break
            yield first, piece
            first += len(piece)
        else:
            if first == self.count:
                return
        raise ValueError(f"the pieces hold other than the {self.count} elements they were given as")


def encode(values: npt.ArrayLike | Pieces, bound: float, fanin: int, dtype: npt.DTypeLike = np.int32,
           out: np.ndarray | None = None) -> tuple[int, np.ndarray]:
    """`encode_definition`, bit for bit (tests/test_codec_average.py holds it to that), in float32: for
    float32 values that fit, scaling by a power of two is exact in float32 (|x / 2**e| <= 2**31; a result too
    small to be normal rounds to 0 either way), so rounding it gives the same integer as in float64. With the
    compiled kernel one pass scales, rounds and converts while it finds the peak; with numpy, two passes find
    the extremes and one scales, rounds and converts block by block, with no temporary the size of the vector.
    `values`: one vector, or `Pieces` of one, each quantized straight into its place. `dtype`: int32 in either
    byte order (the client asks for the wire's big-endian, so that the elements need no second conversion).
    `out`: where the elements go (len(values) + 1 of `dtype`), else a new array. Values that do not fit (a
    re-send follows) take the definition, piece by piece."""
    pieces = values if isinstance(values, Pieces) else Pieces.of(np.asarray(values, dtype=np.float32).reshape(-1))
    exponent = choose_exponent(bound, fanin)
    dtype = np.dtype(dtype)
    elements = np.empty(pieces.count + 1, dtype=dtype) if out is None else out
    if elements.dtype != dtype or elements.shape != (pieces.count + 1,):
        raise ValueError(f"out must be {pieces.count + 1} {dtype}, got {elements.shape} {elements.dtype}")
    compiled_pass = (compiled is not None and exponent > EXPONENT_MIN and dtype.kind == "i"
                     and dtype.itemsize == ELEMENT_BYTES)
    peak, finite = 0.0, True
    if compiled_pass:
        # The elements of values beyond the limit are written too, and rewritten below.
        for first, piece in pieces.placed():
            place = elements[first:first + len(piece)]
            piece_peak, piece_finite = compiled.quantize(piece, math.ldexp(1.0, -exponent), place, _big_endian(dtype))
            peak, finite = max(peak, piece_peak), finite and piece_finite
    else:
        for _, piece in pieces.placed():
            if piece.size:
                low, high = float(piece.min()), float(piece.max())
                peak, finite = max(peak, -low, high), finite and math.isfinite(low) and math.isfinite(high)
    if not finite:
        raise ValueError("values contain NaN or infinity")
    if peak > math.ldexp(INT32_MAX, exponent):
        # The definition's clipped elements and the doublings its sum asks for, piece by piece.
        limit = math.ldexp(INT32_MAX, exponent)
        for first, piece in pieces.placed():
            elements[first:first + len(piece)] = quantize(np.clip(piece.astype(np.float64), -limit, limit), exponent)
        elements[-1] = math.ceil(math.log2(peak / limit))
        return exponent, elements
    if not compiled_pass:
        # 2**-exponent is a float32 for every exponent but the floor's (2**128): the product is then ldexp's.
        factor = np.float32(math.ldexp(1.0, -exponent)) if exponent > EXPONENT_MIN else None
        scratch = np.empty(min(pieces.count, ENCODE_BLOCK), dtype=np.float32)
        for start, piece in pieces.placed():
            for first in range(0, len(piece), ENCODE_BLOCK):
                block = piece[first:first + ENCODE_BLOCK]
                scaled = scratch[:len(block)]
                if factor is not None:
                    np.multiply(block, factor, out=scaled)
                else:
                    np.ldexp(block, np.int32(-exponent), out=scaled)
                np.rint(scaled, out=scaled)
                np.copyto(elements[start + first:start + first + len(block)], scaled, casting="unsafe")
    elements[-1] = 0
    return exponent, elements


def decode_definition(sums: np.ndarray, overflow: bool, exponent: int, fanin: int,
                      bound: float) -> tuple[np.ndarray | None, float]:
    """(average or None, next bound): the average if the sum is usable, else the bound to try next. The
    definition, through `codec.dequantize`; `decode` computes the same faster."""
    doublings = int(sums[-1])
    if not doublings and not overflow:
        return dequantize(np.asarray(sums[:-1]), exponent, fanin), bound
    return None, bound * 2 ** max(1, doublings)


DECODE_BLOCK = 1 << 16
"""Elements `decode` converts at a time: its float64 temporary (512 KiB) stays in cache."""


def decode(sums: npt.ArrayLike, overflow: bool, exponent: int, fanin: int, bound: float,
           out: np.ndarray | None = None) -> tuple[np.ndarray | None, float]:
    """`decode_definition`, bit for bit (tests/test_codec_average.py holds it to that), for sums of any
    integer type and byte order (the client passes the big-endian sums as they came off the wire). The same
    float64 operations per element as `codec.dequantize`, block by block into the float32 average: no int32
    copy and no float64 temporary the size of the vector, whose memory traffic cost more than the arithmetic.
    `out`: a float32 array for the average, which may share the sums' memory (a block is read whole before
    its averages are written): the client decodes in place, so that a 100 MB averaging does not fault in
    another 100 MB of fresh pages."""
    sums = np.asarray(sums)
    if sums.dtype.kind not in "iu" or sums.ndim != 1:
        return decode_definition(sums, overflow, exponent, fanin, bound)
    doublings = int(sums[-1])
    if doublings or overflow:
        return None, bound * 2 ** max(1, doublings)
    dequantize(sums[:0], exponent, fanin)  # the definition's checks of exponent and fan-in
    elements = len(sums) - 1
    average = np.empty(elements, dtype=np.float32) if out is None else out
    if average.dtype != np.float32 or average.shape != (elements,):
        raise ValueError(f"out must be {elements} float32, got {average.shape} {average.dtype}")
    scale = math.ldexp(1.0, exponent)
    if compiled is not None and sums.dtype.itemsize == ELEMENT_BYTES and sums.dtype.kind == "i" \
            and sums.flags.c_contiguous and average.flags.c_contiguous:
        compiled.dequantize(sums[:-1], scale, fanin, average,
                            _big_endian(sums.dtype))
        return average, bound
    scratch = np.empty(min(elements, DECODE_BLOCK), dtype=np.float64)
    for first in range(0, elements, DECODE_BLOCK):
        last = min(first + DECODE_BLOCK, elements)
        block = scratch[:last - first]
        np.copyto(block, sums[first:last])
        np.multiply(block, scale, out=block)
        np.divide(block, fanin, out=block)
        np.copyto(average[first:last], block, casting="same_kind")
    return average, bound


def aggregate(contributions: Sequence[np.ndarray]) -> tuple[np.ndarray, bool]:
    """The aggregator's sum of int32 contributions in arrival order, saturating at each, and its overflow flag."""
    sums = np.zeros(len(contributions[0]), dtype=np.int64)
    overflow = False
    for elements in contributions:
        total = sums + elements
        overflow |= bool(((total > INT32_MAX) | (total < INT32_MIN)).any())
        sums = np.clip(total, INT32_MIN, INT32_MAX)
    return sums, overflow


def clique_average(vectors: Sequence[npt.ArrayLike], bound: float = 16.0) -> np.ndarray:
    """The average every member of a clique ends with, given each member's float32 vector (in member order)."""
    fanin = len(vectors)
    for _ in range(AVERAGING_ATTEMPTS):
        encoded = [encode(vector, bound, fanin) for vector in vectors]
        exponent = encoded[0][0]
        sums, overflow = aggregate([elements for _, elements in encoded])
        average, bound = decode(sums, overflow, exponent, fanin, bound)
        if average is not None:
            return average
    raise AveragingError(f"sums still overflow at a bound of {bound}")
