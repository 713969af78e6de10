"""AXI-Stream-like interfaces and width conversion between a byte-wide MAC and a wide core.

A beat carries byte k of the frame in tdata[8k+7:8k]; tkeep marks valid lanes and is always a prefix
(lanes 0..n-1), which is what a MAC and the aggregator produce. tuser on the last beat means "abort
this frame": whoever stores the frame drops it.
"""

from amaranth.hdl import Elaboratable, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out


def axis_signature(width):
    """Source-side signature of a stream of `width` bytes per beat."""
    return wiring.Signature({
        "tdata": Out(8 * width),
        "tkeep": Out(width),
        "tlast": Out(1),
        "tuser": Out(1),
        "tvalid": Out(1),
        "tready": In(1),
    })


def connect_core(m, core, source, sink):
    """Wire a core with the aggregator's flat ports (`s_axis_t*`, `m_axis_t*`) between two streams of
    `axis_signature`: `source` feeds the core's input, the core's output (abort flag included) feeds `sink`."""
    m.d.comb += [
        core.s_axis_tdata.eq(source.tdata), core.s_axis_tkeep.eq(source.tkeep),
        core.s_axis_tlast.eq(source.tlast), core.s_axis_tvalid.eq(source.tvalid),
        source.tready.eq(core.s_axis_tready),
        sink.tdata.eq(core.m_axis_tdata), sink.tkeep.eq(core.m_axis_tkeep),
        sink.tlast.eq(core.m_axis_tlast), sink.tuser.eq(core.m_axis_tuser),
        sink.tvalid.eq(core.m_axis_tvalid), core.m_axis_tready.eq(sink.tready),
    ]


class Upsizer(wiring.Component):
    """Packs a byte stream into beats of `width` bytes; a frame's last beat may be partial."""

    def __init__(self, width):
        self.width = width
        super().__init__({"i": In(axis_signature(1)), "o": Out(axis_signature(width))})

    def elaborate(self, platform):
        m = Module()
        width = self.width
        lane = Signal(range(width))
        data = Signal(8 * width)
        keep = Signal(width)

        m.d.comb += self.i.tready.eq(~self.o.tvalid | self.o.tready)
        with m.If(self.o.tvalid & self.o.tready):
            m.d.sync += self.o.tvalid.eq(0)

        with m.If(self.i.tvalid & self.i.tready):
            next_data = Signal.like(data)
            next_keep = Signal.like(keep)
            m.d.comb += [next_data.eq(data), next_keep.eq(keep)]
            m.d.comb += [next_data.word_select(lane, 8).eq(self.i.tdata), next_keep.bit_select(lane, 1).eq(1)]
            with m.If(self.i.tlast | (lane == width - 1)):
                m.d.sync += [
                    self.o.tdata.eq(next_data),
                    self.o.tkeep.eq(next_keep),
                    self.o.tlast.eq(self.i.tlast),
                    self.o.tuser.eq(self.i.tlast & self.i.tuser),
                    self.o.tvalid.eq(1),
                    lane.eq(0),
                    keep.eq(0),
                ]
            with m.Else():
                m.d.sync += [data.eq(next_data), keep.eq(next_keep), lane.eq(lane + 1)]
        return m


class Downsizer(wiring.Component):
    """Unpacks beats of `width` bytes into a byte stream, one byte per cycle without bubbles."""

    def __init__(self, width):
        self.width = width
        super().__init__({"i": In(axis_signature(width)), "o": Out(axis_signature(1))})

    def elaborate(self, platform):
        m = Module()
        width = self.width
        data = Signal(8 * width)
        keep = Signal(width)
        last = Signal()
        user = Signal()
        valid = Signal()
        lane = Signal(range(width))

        final_lane = Signal()
        if width == 1:
            m.d.comb += final_lane.eq(1)
        else:
            m.d.comb += final_lane.eq((lane == width - 1) | ~keep.bit_select(lane + 1, 1))

        m.d.comb += [
            self.o.tdata.eq(data.word_select(lane, 8)),
            self.o.tkeep.eq(1),
            self.o.tlast.eq(last & final_lane),
            self.o.tuser.eq(user & last & final_lane),
            self.o.tvalid.eq(valid),
            self.i.tready.eq(~valid | (self.o.tready & final_lane)),
        ]
        with m.If(valid & self.o.tready & ~final_lane):
            m.d.sync += lane.eq(lane + 1)
        with m.If(self.i.tready):
            m.d.sync += [
                data.eq(self.i.tdata),
                keep.eq(self.i.tkeep),
                last.eq(self.i.tlast),
                user.eq(self.i.tuser),
                valid.eq(self.i.tvalid),
                lane.eq(0),
            ]
        return m


class StreamRegister(Elaboratable):
    """A full-throughput register slice (valid/ready skid buffer) for one stream."""

    def __init__(self, width):
        self.i = axis_signature(width).flip().create()
        self.o = axis_signature(width).create()

    def elaborate(self, platform):
        m = Module()
        fields = ("tdata", "tkeep", "tlast", "tuser")
        skid = {name: Signal.like(getattr(self.i, name), name=f"skid_{name}") for name in fields}
        skid_valid = Signal()

        m.d.comb += self.i.tready.eq(~skid_valid)
        with m.If(~self.o.tvalid | self.o.tready):
            m.d.sync += self.o.tvalid.eq(self.i.tvalid | skid_valid)
            with m.If(skid_valid):
                m.d.sync += [getattr(self.o, name).eq(skid[name]) for name in fields]
                m.d.sync += skid_valid.eq(0)
            with m.Else():
                m.d.sync += [getattr(self.o, name).eq(getattr(self.i, name)) for name in fields]
        with m.Elif(self.i.tvalid & self.i.tready):
            m.d.sync += [skid[name].eq(getattr(self.i, name)) for name in fields]
            m.d.sync += skid_valid.eq(1)
        return m
