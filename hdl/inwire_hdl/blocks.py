"""Combinational building blocks of the aggregator, small enough to unit-test on their own.

Elements travel in wire order: lane l of a beat holds element bytes 4l..4l+3 with the most significant
byte first, so byte 4l sits in the lowest bits of the lane.
"""

from amaranth.hdl import Cat, Const, Module, Mux, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .layout import FRAME_HEADER, field_value

INT32_MIN, INT32_MAX = -2**31, 2**31 - 1


def lane_value(lane):
    """A 4-byte lane in wire order as a signed 32-bit number."""
    return Cat(lane[24:32], lane[16:24], lane[8:16], lane[0:8]).as_signed()


def lane_bytes(value):
    """A 32-bit number as a 4-byte lane in wire order."""
    return Cat(value[24:32], value[16:24], value[8:16], value[0:8])


def popcount(value):
    return sum(value[i] for i in range(len(value)))


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


class IPv4Checksum(wiring.Component):
    """Checks a captured header's IPv4 checksum, and computes the checksum the header should carry.

    `header` holds the 128 header bytes in FRAME_HEADER order (byte 0 in the lowest bits).

    `valid`: the ones-complement sum of all ten words is 0xFFFF. `checksum`: the value for the checksum
    field, computed as if that field were zero.
    """

    def __init__(self):
        super().__init__({
            "header": In(FRAME_HEADER.size),
            "valid": Out(1),
            "checksum": Out(16),
        })

    def elaborate(self, platform):
        m = Module()
        header = data.View(FRAME_HEADER, self.header)
        total = sum(ipv4_words(header))
        m.d.comb += [
            self.valid.eq(fold16(total) == 0xFFFF),
            self.checksum.eq(~fold16(total - field_value(header, "ip_csum"))),
        ]
        return m
