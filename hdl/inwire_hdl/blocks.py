"""Combinational building blocks of the aggregator, small enough to unit-test on their own.

Elements travel in wire order: lane l of a beat holds element bytes 4l..4l+3 with the most significant
byte first, so byte 4l sits in the lowest bits of the lane.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Shape, signed
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from inwire.protocol import INT32_MAX, INT32_MIN


def lane_value(lane):
    """A 4-byte lane in wire order as a signed 32-bit number."""
    return Cat(lane[24:32], lane[16:24], lane[8:16], lane[0:8]).as_signed()


def lane_bytes(value):
    """A 32-bit number as a 4-byte lane in wire order."""
    return Cat(value[24:32], value[16:24], value[8:16], value[0:8])


def popcount(value):
    """Bits set in `value`, summed as a balanced tree (a chained sum would be one carry chain per bit)."""
    terms = [value[i] for i in range(len(value))]
    if not terms:
        return Const(0, 1)
    while len(terms) > 1:
        terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i] for i in range(0, len(terms), 2)]
    return terms[0]


def fold16(total):
    """End-around carry of a ones-complement sum of at most 2**16 words, folded to 16 bits."""
    once = total[:16] + total[16:]
    return (once[:16] + once[16:])[:16]


class SaturatingAdder(wiring.Component):
    """Adds `lanes` int32 elements of two beats in wire order, clamping each sum at the int32 limits.

    `saturated` has one bit per lane that hit a limit; `base_zero` replaces `a` by zeros (a slot's first
    contribution starts from an empty sum without the memory being cleared).
    """

    def __init__(self, lanes):
        self.lanes = lanes
        super().__init__({
            "a": In(32 * lanes),
            "b": In(32 * lanes),
            "base_zero": In(1),
            "sum": Out(32 * lanes),
            "saturated": Out(lanes),
        })

    def elaborate(self, platform):
        m = Module()
        for lane in range(self.lanes):
            bits = slice(32 * lane, 32 * lane + 32)
            base = Mux(self.base_zero, 0, lane_value(self.a[bits]))
            total = (base + lane_value(self.b[bits])).as_signed()
            high, low = total > INT32_MAX, total < INT32_MIN
            clamped = Mux(high, Const(INT32_MAX, signed(32)), Mux(low, Const(INT32_MIN, signed(32)), total[:32]))
            m.d.comb += [
                self.sum[bits].eq(lane_bytes(clamped)),
                self.saturated[lane].eq(high | low),
            ]
        return m


def ipv4_words(header):
    """The ten 16-bit words of a FRAME_HEADER view's IPv4 header, in order."""
    names = ("ip_ver_ihl", "ip_tos", "ip_len", "ip_id", "ip_frag", "ip_ttl", "ip_proto", "ip_csum",
             "ip_src", "ip_dst")
    raw = Cat(*(getattr(header, name).as_value() for name in names))
    return [Cat(raw[16 * i + 8:16 * i + 16], raw[16 * i:16 * i + 8]) for i in range(10)]


class RegisteredFIFO(wiring.Component):
    """A synchronous FIFO of `depth` entries of `shape` whose `r_data` comes from a register, not from the
    memory's read port (a block RAM's clock-to-output would start every path that uses it).

    Same interface as `amaranth.lib.fifo.SyncFIFOBuffered`: `w_data`/`w_en`/`w_rdy`, `r_data`/`r_en`/`r_rdy`,
    and the same ports as streams, `w_stream` and `r_stream`.
    """

    def __init__(self, shape, depth):
        if depth < 3:
            raise ValueError(f"depth must be at least 3, got {depth}")
        self.shape, self.depth = shape, depth
        self.width = Shape.cast(shape).width
        super().__init__({
            "w_data": In(shape), "w_en": In(1), "w_rdy": Out(1),
            "r_data": Out(shape), "r_en": In(1), "r_rdy": Out(1),
        })

    @property
    def w_stream(self):
        w_stream = stream.Signature(self.shape).flip().create()
        w_stream.payload, w_stream.valid, w_stream.ready = self.w_data, self.w_en, self.w_rdy
        return w_stream

    @property
    def r_stream(self):
        r_stream = stream.Signature(self.shape).create()
        r_stream.payload, r_stream.valid, r_stream.ready = self.r_data, self.r_rdy, self.r_en
        return r_stream

    def elaborate(self, platform):
        m = Module()
        m.submodules.inner = inner = SyncFIFOBuffered(width=self.width, depth=self.depth - 1)
        load = inner.r_rdy & (~self.r_rdy | self.r_en)
        m.d.comb += [
            inner.w_data.eq(self.w_data), inner.w_en.eq(self.w_en), self.w_rdy.eq(inner.w_rdy),
            inner.r_en.eq(load),
        ]
        with m.If(load):
            m.d.sync += [self.r_data.eq(inner.r_data), self.r_rdy.eq(1)]
        with m.Elif(self.r_en):
            m.d.sync += self.r_rdy.eq(0)
        return m
