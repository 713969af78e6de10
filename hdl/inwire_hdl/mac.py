"""1 GbE MAC at the GMII level (one byte per clock), plus the buffering that makes it usable.

`MacRx` strips preamble/SFD and FCS, checks FCS, runts and oversize frames; it cannot stall (GMII has no
back-pressure), so `PacketFifo` stores each frame and keeps it only if the MAC says it was good.
`MacTx` adds preamble/SFD, pads to the 60-byte minimum, appends the FCS and keeps the inter-frame gap;
its input must not run dry inside a frame, which the store-and-forward `PacketFifo` in front of it
guarantees. `EthMac` ties both to a core clock domain through async FIFOs and width converters.
RGMII is the thin DDR layer in `inwire_hdl.rgmii`. The FCS is `amaranth.lib.crc`'s CRC-32 Ethernet, one
byte per step.
"""

from amaranth.hdl import Array, Cat, DomainRenamer, Module, Mux, Signal
from amaranth.lib import fifo, wiring
from amaranth.lib.crc.catalog import CRC32_ETHERNET
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .width import Downsizer, StreamRegister, Upsizer, axis_signature

PREAMBLE = 0x55
SFD = 0xD5
FCS = CRC32_ETHERNET(8)
"""The FCS over one byte per clock; its `crc` output is the value sent, least significant byte first."""
MIN_FRAME = 64
"""Smallest frame on the wire, FCS included; shorter received frames are runts."""
FCS_BYTES = 4
IFG_BYTES = 12
DEFAULT_MAX_FRAME = 9216
"""Largest frame accepted, FCS included (jumbo frames up to a 9198-byte IP MTU)."""

BANK_DEPTH = 2048
"""Entries of one ECP5 block RAM (DP16KD) at 9 bits: the packet FIFOs are built from such banks."""

RX_COUNTERS = ("frames_ok", "bad_fcs", "runts", "oversize", "rx_errors", "overflows")
TX_COUNTERS = ("frames_sent", "underruns", "aborted")


def gmii_rx_signature():
    return wiring.Signature({"rx_dv": Out(1), "rx_er": Out(1), "rxd": Out(8)})


def gmii_tx_signature():
    return wiring.Signature({"tx_en": Out(1), "tx_er": Out(1), "txd": Out(8)})


class PacketFifo(wiring.Component):
    """FIFO of `width`-byte beats that only releases whole frames: a frame is committed by its last
    beat unless tuser (abort) is set with it, in which case it is rewound as if never written.

    With `lossy`, the source cannot stall (the receive MAC): a byte that meets a full FIFO marks the
    frame as overflowed and it is dropped at its end. Otherwise tready stalls the source while the
    FIFO is full, except when the frame alone fills it: it would never be released, so it is dropped
    the same way. `depth` (in beats) must be a power of two; the memory is split into banks of
    `bank_depth` entries.
    """

    def __init__(self, depth, *, lossy, width=1, bank_depth=BANK_DEPTH):
        assert depth & (depth - 1) == 0 and depth >= 16
        self.depth = depth
        self.lossy = lossy
        self.width = width
        self.bank_depth = min(depth, bank_depth)
        super().__init__({
            "i": In(axis_signature(width)),
            "o": Out(axis_signature(width)),
            "committed": Out(1),
            "dropped": Out(1),
            "overflowed": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        depth = self.depth
        bank_depth = self.bank_depth
        nbanks = depth // bank_depth
        # A byte-wide FIFO stores no tkeep: it is always 1, and 9 bits fit a block RAM exactly.
        keep_in = self.i.tkeep if self.width > 1 else Cat()
        entry_bits = 8 * self.width + len(keep_in) + 1
        bank_bits = (bank_depth - 1).bit_length()

        wr_ptr = Signal(range(depth))
        commit_ptr = Signal(range(depth))
        rd_ptr = Signal(range(depth))
        overflow = Signal()

        # `full` is registered to keep the pointer arithmetic off the tready path. Both candidates are
        # computed from registers only: after a rewind the level is what is committed, otherwise it
        # grows by at most one per cycle, which the lower threshold leaves room for.
        # `alone` (nothing committed left to read) is registered too. It can only be stale by one cycle
        # after a commit, when the FIFO held nothing but the frame being written and so is not full,
        # provided a frame is shorter than depth - 4 (`EthMac` sizes the FIFO for that).
        full = Signal()
        alone = Signal()
        overflow_now = Signal()
        rewind = Signal()
        m.d.comb += [
            overflow_now.eq(full & (1 if self.lossy else alone)),
            self.i.tready.eq(~full | overflow_now),
        ]
        m.d.sync += [
            full.eq(Mux(rewind, (commit_ptr - rd_ptr)[:len(wr_ptr)] >= depth - 3,
                        (wr_ptr - rd_ptr)[:len(wr_ptr)] >= depth - 4)),
            alone.eq(rd_ptr == commit_ptr),
        ]
        write = Signal()
        m.d.comb += write.eq(self.i.tvalid & ~full & ~overflow)
        m.d.sync += [self.committed.eq(0), self.dropped.eq(0), self.overflowed.eq(0)]
        with m.If(self.i.tvalid & self.i.tready):
            drop = overflow | full | self.i.tuser
            with m.If(self.i.tlast):
                m.d.sync += overflow.eq(0)
                with m.If(drop):
                    m.d.comb += rewind.eq(1)
                    m.d.sync += [wr_ptr.eq(commit_ptr), self.dropped.eq(1), self.overflowed.eq(overflow | full)]
                with m.Else():
                    m.d.sync += [wr_ptr.eq(wr_ptr + 1), commit_ptr.eq(wr_ptr + 1), self.committed.eq(1)]
            with m.Elif(full):
                m.d.sync += overflow.eq(1)
            with m.Elif(~overflow):
                m.d.sync += wr_ptr.eq(wr_ptr + 1)

        # Read pipeline, all stages advancing together: block RAM (its clock-to-output is slow on ECP5),
        # one register per bank so that no logic follows the RAM, then the bank mux into a register slice.
        m.submodules.out_reg = out_reg = StreamRegister(self.width)
        read = out_reg.i
        advance = Signal()
        m.d.comb += advance.eq(~read.tvalid | read.tready)
        ram_valid = Signal()
        # Bank of the entry in the RAM output and in the held registers (one bit when there is one bank).
        ram_bank = Signal(range(max(nbanks, 2)))
        held_bank = Signal.like(ram_bank)
        held = []
        for index in range(nbanks):
            bank = Memory(shape=entry_bits, depth=bank_depth, init=[])
            m.submodules[f"bank{index}"] = bank
            wr = bank.write_port()
            rd = bank.read_port(domain="sync")
            m.d.comb += [
                wr.addr.eq(wr_ptr[:bank_bits]),
                wr.data.eq(Cat(self.i.tdata, keep_in, self.i.tlast)),
                wr.en.eq(write & (wr_ptr[bank_bits:] == index if nbanks > 1 else 1)),
                rd.addr.eq(rd_ptr[:bank_bits]),
                rd.en.eq(advance),
            ]
            register = Signal(entry_bits, name=f"held{index}")
            with m.If(advance):
                m.d.sync += register.eq(rd.data)
            held.append(register)
        selected = Signal(entry_bits)
        m.d.comb += selected.eq(Array(held)[held_bank] if nbanks > 1 else held[0])
        m.d.comb += [read.tdata.eq(selected[:8 * self.width]), read.tlast.eq(selected[-1])]
        m.d.comb += read.tkeep.eq(selected[8 * self.width:-1] if self.width > 1 else 1)
        with m.If(advance):
            m.d.sync += [
                ram_valid.eq(rd_ptr != commit_ptr),
                ram_bank.eq(rd_ptr[bank_bits:]),
                read.tvalid.eq(ram_valid),
                held_bank.eq(ram_bank),
            ]
            with m.If(rd_ptr != commit_ptr):
                m.d.sync += rd_ptr.eq(rd_ptr + 1)
        wiring.connect(m, out_reg.o, wiring.flipped(self.o))
        return m


class MacRx(wiring.Component):
    """GMII receiver: the frame without preamble, SFD and FCS as a byte stream that cannot stall.

    The stream's last byte carries tuser = "drop": bad FCS, runt (< 64 bytes with FCS), oversize
    (> max_frame) or a GMII receive error. Fragments of five bytes or fewer never reach the stream
    and are only counted. One-cycle `count_*` strobes feed counters.
    """

    def __init__(self, max_frame=DEFAULT_MAX_FRAME):
        self.max_frame = max_frame
        super().__init__({
            "gmii": In(gmii_rx_signature()),
            "o": Out(axis_signature(1)),
            **{f"count_{name}": Out(1) for name in RX_COUNTERS if name != "overflows"},
        })

    def elaborate(self, platform):
        m = Module()
        rx_dv = Signal()
        rx_er = Signal()
        rxd = Signal(8)
        m.d.sync += [rx_dv.eq(self.gmii.rx_dv), rx_er.eq(self.gmii.rx_er), rxd.eq(self.gmii.rxd)]

        # Run over the frame and its FCS, the CRC ends at the residue (`match_detected`) exactly when the
        # FCS is right: the check needs no knowledge of where the frame ends before it has ended.
        m.submodules.crc = crc = FCS.create()
        m.d.comb += crc.data.eq(rxd)
        length = Signal(range(self.max_frame + 2))
        too_long = Signal()
        errored = Signal()
        # The newest four bytes may be the FCS and the byte before them the last data byte, which is
        # only known to be last when rx_dv falls: hence a five-byte delay line.
        delay = [Signal(8, name=f"delay{index}") for index in range(FCS_BYTES + 1)]
        filled = Signal(range(FCS_BYTES + 2))

        m.d.comb += self.o.tkeep.eq(1)
        m.d.sync += [self.o.tvalid.eq(0)]
        m.d.sync += [getattr(self, f"count_{name}").eq(0) for name in RX_COUNTERS if name != "overflows"]

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += crc.start.eq(1)
                m.d.sync += [length.eq(0), too_long.eq(0), errored.eq(0), filled.eq(0)]
                with m.If(rx_dv & (rxd == SFD)):
                    m.next = "DATA"
                with m.Elif(rx_dv & (rxd == PREAMBLE)):
                    m.next = "PREAMBLE"
                with m.Elif(rx_dv):
                    m.next = "DISCARD"
            with m.State("PREAMBLE"):
                with m.If(~rx_dv):
                    m.next = "IDLE"
                with m.Elif(rxd == SFD):
                    m.next = "DATA"
                with m.Elif(rxd != PREAMBLE):
                    m.next = "DISCARD"
            with m.State("DISCARD"):
                with m.If(~rx_dv):
                    m.next = "IDLE"
            with m.State("DATA"):
                with m.If(rx_dv):
                    m.d.comb += crc.valid.eq(1)
                    m.d.sync += [
                        Cat(*delay).eq(Cat(rxd, *delay[:-1])),
                        errored.eq(errored | rx_er),
                    ]
                    with m.If(length == self.max_frame):
                        m.d.sync += too_long.eq(1)
                    with m.Else():
                        m.d.sync += length.eq(length + 1)
                    with m.If(filled == FCS_BYTES + 1):
                        m.d.sync += [
                            self.o.tdata.eq(delay[-1]),
                            self.o.tlast.eq(0),
                            self.o.tuser.eq(0),
                            self.o.tvalid.eq(~too_long),
                        ]
                    with m.Else():
                        m.d.sync += filled.eq(filled + 1)
                with m.Else():
                    bad_fcs = ~crc.match_detected
                    runt = length < MIN_FRAME
                    drop = bad_fcs | runt | too_long | errored
                    m.d.sync += [
                        self.o.tdata.eq(delay[-1]),
                        self.o.tlast.eq(1),
                        self.o.tuser.eq(drop),
                        self.o.tvalid.eq(filled == FCS_BYTES + 1),
                        self.count_frames_ok.eq(~drop),
                        self.count_rx_errors.eq(errored),
                        self.count_runts.eq(~errored & runt),
                        self.count_oversize.eq(~errored & too_long),
                        self.count_bad_fcs.eq(~errored & ~runt & ~too_long & bad_fcs),
                    ]
                    m.next = "IDLE"
        return m


class MacTx(wiring.Component):
    """GMII transmitter: preamble + SFD, the frame, zero padding to 60 bytes, FCS, 12-byte gap.

    The input must deliver a whole frame without gaps once its first byte is taken; a gap is sent as a
    GMII transmit error (the receiver discards the frame) and counted as an underrun.
    """

    def __init__(self):
        super().__init__({
            "i": In(axis_signature(1)),
            "gmii": Out(gmii_tx_signature()),
            **{f"count_{name}": Out(1) for name in TX_COUNTERS if name != "aborted"},
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.crc = crc = FCS.create()
        count = Signal(range(max(IFG_BYTES, MIN_FRAME) + 1))
        fcs = Signal(24)

        m.d.sync += [self.gmii.tx_en.eq(0), self.gmii.tx_er.eq(0), self.gmii.txd.eq(0)]
        m.d.sync += [self.count_frames_sent.eq(0), self.count_underruns.eq(0)]

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += crc.start.eq(1)
                m.d.sync += count.eq(0)
                with m.If(self.i.tvalid):
                    m.next = "PREAMBLE"
            with m.State("PREAMBLE"):
                m.d.sync += [self.gmii.tx_en.eq(1), self.gmii.txd.eq(PREAMBLE), count.eq(count + 1)]
                with m.If(count == 7):
                    m.d.sync += [self.gmii.txd.eq(SFD), count.eq(0)]
                    m.next = "DATA"
            with m.State("DATA"):
                m.d.comb += self.i.tready.eq(1)
                m.d.sync += [self.gmii.tx_en.eq(1), self.gmii.txd.eq(self.i.tdata)]
                with m.If(~self.i.tvalid):
                    m.d.sync += [self.gmii.tx_er.eq(1), self.count_underruns.eq(1)]
                with m.Else():
                    m.d.comb += [crc.data.eq(self.i.tdata), crc.valid.eq(1)]
                    with m.If(count < MIN_FRAME - FCS_BYTES):
                        m.d.sync += count.eq(count + 1)
                    with m.If(self.i.tlast):
                        with m.If(count < MIN_FRAME - FCS_BYTES - 1):
                            m.next = "PAD"
                        with m.Else():
                            m.next = "FCS"
            with m.State("PAD"):
                # The padding is covered by the FCS: the CRC takes zero bytes (`data` is 0 outside DATA).
                m.d.comb += crc.valid.eq(1)
                m.d.sync += [self.gmii.tx_en.eq(1), self.gmii.txd.eq(0), count.eq(count + 1)]
                with m.If(count == MIN_FRAME - FCS_BYTES - 1):
                    m.next = "FCS"
            with m.State("FCS"):
                m.d.sync += [
                    self.gmii.tx_en.eq(1),
                    self.gmii.txd.eq(crc.crc[:8]),
                    fcs.eq(crc.crc[8:]),
                    count.eq(1),
                ]
                m.next = "FCS_REST"
            with m.State("FCS_REST"):
                m.d.sync += [self.gmii.tx_en.eq(1), self.gmii.txd.eq(fcs[:8]), fcs.eq(fcs >> 8)]
                m.d.sync += count.eq(count + 1)
                with m.If(count == FCS_BYTES - 1):
                    m.d.sync += [count.eq(0), self.count_frames_sent.eq(1)]
                    m.next = "GAP"
            with m.State("GAP"):
                m.d.sync += count.eq(count + 1)
                # IDLE takes one more idle byte before the preamble starts.
                with m.If(count == IFG_BYTES - 2):
                    m.next = "IDLE"
        return m


class EventCounters(wiring.Component):
    """Wrapping 32-bit counters of one-cycle strobes."""

    def __init__(self, names, width=32):
        self.names = tuple(names)
        super().__init__({
            **{f"inc_{name}": In(1) for name in self.names},
            **{name: Out(width) for name in self.names},
        })

    def elaborate(self, platform):
        m = Module()
        for name in self.names:
            with m.If(getattr(self, f"inc_{name}")):
                m.d.sync += getattr(self, name).eq(getattr(self, name) + 1)
        return m


class EthMac(wiring.Component):
    """One Ethernet port: GMII in domains `rx` and `tx`, frames as `width`-byte beats in `sync`.

    Receive: MacRx -> PacketFifo (drops bad frames, rx) -> Upsizer (rx) -> AsyncFIFO -> `rx_stream`.
    Transmit: `tx_stream` -> AsyncFIFO -> register slice and Downsizer (tx) -> PacketFifo (store-and-forward, drops
    aborted frames) -> MacTx. Width conversion sits in the 125 MHz MAC domains so that the core
    domain only needs `width` bytes x f_core >= 1 Gb/s. Counters live in the MAC domains; `rx_*` and
    `tx_*` outputs are their values (for LEDs and debug, not synchronized to `sync`).
    """

    def __init__(self, width, *, max_frame=DEFAULT_MAX_FRAME, cdc_depth=16):
        self.width = width
        self.max_frame = max_frame
        self.cdc_depth = cdc_depth
        self.fifo_depth = 1 << (max_frame + 4).bit_length()
        super().__init__({
            "gmii_rx": In(gmii_rx_signature()),
            "gmii_tx": Out(gmii_tx_signature()),
            "rx_stream": Out(axis_signature(width)),
            "tx_stream": In(axis_signature(width)),
            **{f"rx_{name}": Out(32) for name in RX_COUNTERS},
            **{f"tx_{name}": Out(32) for name in TX_COUNTERS},
        })

    def elaborate(self, platform):
        m = Module()
        width = self.width
        beat_bits = 8 * width + width + 2

        rx = DomainRenamer("rx")
        m.submodules.mac_rx = mac_rx = rx(MacRx(self.max_frame))
        m.submodules.rx_buffer = rx_buffer = rx(PacketFifo(self.fifo_depth, lossy=True))
        m.submodules.rx_upsizer = rx_upsizer = rx(Upsizer(width))
        m.submodules.rx_cdc = rx_cdc = fifo.AsyncFIFO(width=beat_bits, depth=self.cdc_depth,
                                                      r_domain="sync", w_domain="rx")
        m.submodules.rx_counters = rx_counters = rx(EventCounters(RX_COUNTERS))
        wiring.connect(m, wiring.flipped(self.gmii_rx), mac_rx.gmii)
        wiring.connect(m, mac_rx.o, rx_buffer.i)
        wiring.connect(m, rx_buffer.o, rx_upsizer.i)
        self._stream_into_fifo(m, rx_upsizer.o, rx_cdc)
        self._fifo_into_stream(m, rx_cdc, self.rx_stream)
        for name in RX_COUNTERS:
            strobe = rx_buffer.overflowed if name == "overflows" else getattr(mac_rx, f"count_{name}")
            m.d.comb += [getattr(rx_counters, f"inc_{name}").eq(strobe),
                         getattr(self, f"rx_{name}").eq(getattr(rx_counters, name))]

        tx = DomainRenamer("tx")
        m.submodules.tx_cdc = tx_cdc = fifo.AsyncFIFO(width=beat_bits, depth=self.cdc_depth,
                                                      r_domain="tx", w_domain="sync")
        m.submodules.tx_slice = tx_slice = tx(StreamRegister(width))
        m.submodules.tx_downsizer = tx_downsizer = tx(Downsizer(width))
        m.submodules.tx_buffer = tx_buffer = tx(PacketFifo(self.fifo_depth, lossy=False))
        m.submodules.mac_tx = mac_tx = tx(MacTx())
        m.submodules.tx_counters = tx_counters = tx(EventCounters(TX_COUNTERS))
        self._stream_into_fifo(m, wiring.flipped(self.tx_stream), tx_cdc)
        # The register slice keeps the packet FIFO's tready chain off the async FIFO's read pointer.
        self._fifo_into_stream(m, tx_cdc, tx_slice.i)
        wiring.connect(m, tx_slice.o, tx_downsizer.i)
        wiring.connect(m, tx_downsizer.o, tx_buffer.i)
        wiring.connect(m, tx_buffer.o, mac_tx.i)
        wiring.connect(m, mac_tx.gmii, wiring.flipped(self.gmii_tx))
        for name in TX_COUNTERS:
            strobe = tx_buffer.dropped if name == "aborted" else getattr(mac_tx, f"count_{name}")
            m.d.comb += [getattr(tx_counters, f"inc_{name}").eq(strobe),
                         getattr(self, f"tx_{name}").eq(getattr(tx_counters, name))]
        return m

    @staticmethod
    def _stream_into_fifo(m, stream, cdc):
        m.d.comb += [
            cdc.w_data.eq(Cat(stream.tdata, stream.tkeep, stream.tlast, stream.tuser)),
            cdc.w_en.eq(stream.tvalid),
            stream.tready.eq(cdc.w_rdy),
        ]

    @staticmethod
    def _fifo_into_stream(m, cdc, stream):
        m.d.comb += [
            Cat(stream.tdata, stream.tkeep, stream.tlast, stream.tuser).eq(cdc.r_data),
            stream.tvalid.eq(cdc.r_rdy),
            cdc.r_en.eq(stream.tready),
        ]
