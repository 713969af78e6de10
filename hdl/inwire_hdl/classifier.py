"""The header classifier, the input side's stages I0-I3 and C1-C3 (docs/gateware.md, Components)."""


from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from inwire.model import TIME_BITS
from inwire.protocol import (
    ELEMENT_BYTES,
    ETHERNET_BYTES,
    ETHERTYPE_IPV4,
    FRAME_HEADER_BYTES,
    IP_PROTO_UDP,
    IP_VER_IHL,
    IPV4_BYTES,
    JOB_VERSION,
    MAGIC,
    MIN_FRAME_BYTES,
    MULTICAST_MASK,
    MULTICAST_PREFIX,
    RESULT_TRAILER_BYTES,
    VERSION,
    Disposition,
    Opcode,
)

from .blocks import ipv4_words, popcount
from .job_table import member_query_signature, query_signature
from .layout import field_value
from .signatures import (
    SLOT_KEY,
    Action,
    classified_signature,
    frame_class_layout,
    header_register,
    input_beat_layout,
    lookup_signature,
)


class HeaderClassifier(wiring.Component):
    """Input side, I0-I3 and C1-C3: registers each accepted beat, captures the header from the beats entering
    I0, and classifies the frame whose header ends in a beat while that beat travels to I3. Entering I1 the
    header's decoded flags, fields and partial checksums are registered (C1); entering I2 the frame-length
    checks and the checksum total (C2), while the slot table is read (`lookup`); entering I3 the checks
    before the slot table and the first disposition (C3, `classified.frame`).

    With job tables (`config.registered`) a version 3 frame's job, token, group and slot are looked up in C1
    (`jobs_query`: its slot becomes one of its job's range) and its source in C2 (`member_query`); without,
    those ports are left undriven and read 0.
    """

    def __init__(self, config, data_width, beat_bits):
        self.config, self.data_width, self.beat_bits = config, data_width, beat_bits
        self.header_beats = FRAME_HEADER_BYTES // data_width
        self.slot_bits = max(1, ceil_log2(config.slots))
        self.jobs = config.limits.jobs if config.registered else 1
        self.routes = config.limits.routes if config.registered else 0
        self.children = config.limits.children if config.registered else 0
        super().__init__({
            "s_axis_tdata": In(8 * data_width), "s_axis_tkeep": In(data_width), "s_axis_tlast": In(1),
            "s_axis_tvalid": In(1), "s_axis_tready": Out(1), "lease_tick": In(1),
            "lookup": Out(lookup_signature(self.slot_bits)),
            "classified": Out(classified_signature(data_width, beat_bits, self.jobs, self.routes, self.children)),
            "jobs_query": Out(query_signature(self.jobs, self.slot_bits, self.routes, self.children)),
            "member_query": Out(member_query_signature(self.jobs)),
        })
        # Kept here, not in `elaborate`, so that `header_class` (and a subclass's) can read them.
        stage = input_beat_layout(data_width, beat_bits)
        self.i0, self.i1, self.i2 = (Signal(stage, name=f"i{n}") for n in range(3))
        self.header = header_register("hdr")
        self.header_time = Signal(TIME_BITS)
        cls = frame_class_layout(data_width, beat_bits, self.jobs, self.routes, self.children)
        self.c1, self.c2 = Signal(cls, name="c1"), Signal(cls, name="c2")

    def elaborate(self, platform):
        m = Module()
        self._input(m)
        self._classify_header(m)
        self._classify_lengths(m)
        self._classify_checks(m)
        return m

    def _input(self, m):
        """I0-I3 in lockstep, and the header register filled from the beats entering I0."""
        H, W = self.header_beats, self.data_width
        i0, i1, i2, i3 = self.i0, self.i1, self.i2, self.classified.beat
        in_idx = Signal(self.beat_bits)
        timer = Signal(TIME_BITS)
        adv = self.classified.advance
        with m.If(self.lease_tick):
            m.d.sync += timer.eq(timer + 1)
        m.d.comb += self.s_axis_tready.eq(adv)
        with m.If(adv):
            m.d.sync += [
                i0.valid.eq(self.s_axis_tvalid), i0.data.eq(self.s_axis_tdata), i0.keep.eq(self.s_axis_tkeep),
                i0.last.eq(self.s_axis_tlast), i0.first.eq(in_idx == 0), i0.idx.eq(in_idx),
                i0.hdr_end.eq(self.s_axis_tvalid & (in_idx < H) & (self.s_axis_tlast | (in_idx == H - 1))),
                i1.eq(i0), i1.bytes.eq(popcount(i0.keep)), i2.eq(i1), i3.eq(i2),
            ]
            with m.If(self.s_axis_tvalid):
                m.d.sync += in_idx.eq(Mux(self.s_axis_tlast, 0, Mux(in_idx.all(), in_idx, in_idx + 1)))
                with m.If(in_idx < H):
                    m.d.sync += [
                        self.header.as_value().word_select(in_idx[:ceil_log2(H)], 8 * W).eq(self.s_axis_tdata),
                        self.header_time.eq(timer),
                    ]

    def _classify_header(self, m):
        """C1: everything that needs only the header, the job tables asked about the frame's job."""
        asked = ("job", "token", "group", "slot", "clique") if self.routes else ("job", "token", "group", "slot")
        m.d.comb += [getattr(self.jobs_query, name).eq(field_value(self.header, name)) for name in asked]
        if self.children:
            # A partial's source and members, for the child aggregators of its clique's route.
            bitmap = field_value(self.header, "bitmap")
            sender_bit = Const(1, 64) << field_value(self.header, "sender")[:6]
            m.d.comb += [self.jobs_query.address.eq(field_value(self.header, "ip_src")),
                         self.jobs_query.port.eq(field_value(self.header, "udp_sport")),
                         self.jobs_query.members.eq(Mux(bitmap == 0, sender_bit, bitmap))]
        with m.If(self.classified.advance & self.i0.hdr_end):
            m.d.sync += [getattr(self.c1, name).eq(value) for name, value in self.header_class().items()]

    def header_class(self):
        """What C1 registers about the frame whose header ends: {`frame_class_layout` field: its value} for
        every field that needs only the header. A subclass may register some otherwise (inwire_hdl.mutants)."""
        cfg, W = self.config, self.data_width
        shift = ceil_log2(W)

        def f(name):
            return field_value(self.header, name)

        opcode, count, fanin, sender = f("opcode"), f("count"), f("fanin"), f("sender")
        is_partial = opcode == Opcode.PARTIAL
        summed = (opcode == Opcode.CONTRIBUTION) | is_partial
        # A version 1 frame reads as one with every tree field 0: its sender alone, the whole clique, the root.
        v1 = f("version") == 1
        # Version 3: a registered job's frame. Its level is its clique at this aggregator (the whole clique
        # unless the tables hold a route for it), its route the tables', and its slot one of its job's range.
        # (Without job tables version 3 is dropped as any version not taken: no logic follows it.)
        v3 = (f("version") == JOB_VERSION) if cfg.registered else Const(0)
        taken = Const(0)
        if cfg.unregistered:
            taken = taken | v1 | (f("version") == VERSION)
        if cfg.registered:
            taken = taken | v3
        # A result coming down a tree: only version 3 takes one, from a clique's parent (with routes).
        v3_result = v3 & (opcode == Opcode.RESULT)
        with_trailer = is_partial | v3_result
        payload = summed | v3_result
        query = self.jobs_query
        hit = query.hit
        bitmap, expect = f("bitmap"), f("expect")
        sender_bit = Const(1, 64) << sender[:6]
        clique = Cat(*(fanin > member for member in range(64)))
        hop1 = Mux(v1 | v3, 0, f("hop1"))
        level = Mux(v1 | v3 | (expect == 0), clique, expect)
        level_outside = ~v1 & ~v3 & (expect & ~clique).any()
        partial_out = hop1 != 0
        routed = {}
        if self.routes:
            # A version 3 frame's level is its clique's route's (the whole clique without one or with a level
            # of 0), and a route with a parent sends the level's partial there.
            route_level = Mux(query.routed & (query.level != 0), query.level, clique)
            route_up = v3 & query.routed & query.up
            hop1 = Mux(v1, 0, Mux(v3, Mux(route_up, query.parent, 0), f("hop1")))
            level = Mux(v1 | (~v3 & (expect == 0)), clique, Mux(v3, route_level, expect))
            # A result coming down holds members of the whole clique (the model's `members_valid`).
            members = Mux(bitmap == 0, sender_bit, bitmap)
            level_outside = ~v1 & (Mux(v3_result, members, Mux(v3, route_level, expect)) & ~clique).any()
            partial_out = Mux(v3, route_up, hop1 != 0)
            routed = {"parent_port": query.parent_port}
            if self.children:
                routed["child_ok"] = query.child_ok
        # Where the frame's hops may send this level's partial (the model's `_route_allowed`): up, never to
        # this aggregator or back to the frame's source, only within the upstream prefix; `hop2` only above
        # a `hop1` and distinct from it and from this aggregator. A version 1 frame has no route to check.
        hop1_raw, hop2_raw = f("hop1"), f("hop2")
        network, length = cfg.upstream_prefix
        upstream_mask = (0xFFFFFFFF << (32 - length)) & 0xFFFFFFFF
        route_bad = Mux(v3, Cat(expect, hop1_raw, f("hop1_expect"), hop2_raw, f("hop2_expect")).any(),
                        ~v1 & Mux(hop1_raw == 0, hop2_raw != 0,
                                  (hop1_raw == cfg.ip) | (hop1_raw == f("ip_src"))
                                  | ((hop1_raw & upstream_mask) != network) | (hop2_raw == hop1_raw)
                                  | (hop2_raw == cfg.ip)))
        # Lengths as one adder each (constants folded), the opcode choosing between results; a partial's
        # frame carries its status trailer as one more word after the elements.
        payload_bytes = count * ELEMENT_BYTES
        frame_payload = (count + with_trailer) * ELEMENT_BYTES
        words = ipv4_words(self.header)
        contribution_lengths_ok = ((f("ip_len") == frame_payload + (FRAME_HEADER_BYTES - ETHERNET_BYTES))
                                   & (f("udp_len") == frame_payload + (FRAME_HEADER_BYTES - ETHERNET_BYTES
                                                                       - IPV4_BYTES)))
        request_lengths_ok = ((f("ip_len") == FRAME_HEADER_BYTES - ETHERNET_BYTES)
                              & (f("udp_len") == FRAME_HEADER_BYTES - ETHERNET_BYTES - IPV4_BYTES))
        contribution_end = frame_payload + (FRAME_HEADER_BYTES - 1)
        result_len_hdr = payload_bytes + (FRAME_HEADER_BYTES + RESULT_TRAILER_BYTES)
        return {
            "foreign": ~((f("eth_type") == ETHERTYPE_IPV4) & (f("ip_proto") == IP_PROTO_UDP)
                         & (f("ip_dst") == cfg.ip) & (f("udp_dport") == cfg.port)),
            "bad_ver": f("ip_ver_ihl") != IP_VER_IHL,
            "frag": f("ip_frag")[:14] != 0,
            "bad_magic": (f("magic") != MAGIC) | ~taken,
            "summed": summed, "partial": is_partial, "v1": v1, "v3": v3, "v3_result": v3_result, "payload": payload,
            "members": Mux(v1 | (bitmap == 0), sender_bit, bitmap),
            "level": level, "level_outside": level_outside,
            "hit": hit, "job_bad": v3 & ~hit.any(), "token_bad": v3 & ~(hit & query.token_ok).any(),
            "token": f("token"),
            "hop1": hop1, "partial_out": partial_out, "route_bad": route_bad,
            "out_expect": f("hop1_expect"), "out_hop1": hop2_raw, "out_hop1_expect": f("hop2_expect"),
            "result_req": opcode == Opcode.RESULT_REQUEST,
            "stats_req": opcode == Opcode.STATS_REQUEST,
            "lengths_bad": ~Mux(payload, contribution_lengths_ok, request_lengths_ok),
            "fanin_bad": (fanin == 0) | (fanin > cfg.max_fanin),
            "sender_bad": sender >= fanin,
            "count_bad": (count == 0) | (count > cfg.max_elements),
            "group_bad": Mux(v3, ~(hit & query.group_ok).any(), (f("group") & MULTICAST_MASK) != MULTICAST_PREFIX),
            # A version 3 frame's slot counts within its job's quota; a version 1 or 2 frame may not name one a
            # registered job holds.
            "slot_bad": Mux(v3, ~(hit & query.quota_ok).any(), (f("slot") >= cfg.slots) | query.in_range),
            "csum_a": (words[0] + words[1]) + (words[2] + words[3]),
            "csum_b": (words[4] + words[5]) + (words[6] + words[7]),
            "csum_c": words[8] + words[9],
            "now": self.header_time,
            "slot": f("slot") + Mux(v3, query.base, 0), "slot_rel": f("slot"),
            "job": f("job"), "round": f("round"), "clique": f("clique"),
            "chunk": f("chunk"), "fanin": fanin, "group": f("group"), "count": count,
            "exponent": f("exponent"), "sender": sender,
            "eth_src": f("eth_src"), "ip_src": f("ip_src"), "udp_sport": f("udp_sport"),
            "expected_last": Mux(payload, contribution_end >> shift, (FRAME_HEADER_BYTES - 1) >> shift),
            "expected_tail": Mux(payload, contribution_end[:shift] + 1, ((FRAME_HEADER_BYTES - 1) & (W - 1)) + 1),
            "len_hdr": result_len_hdr,
            "beats_hdr": (payload_bytes + (FRAME_HEADER_BYTES + RESULT_TRAILER_BYTES + W - 1)) >> shift,
            **routed,
        }

    def _classify_lengths(self, m):
        """C2: the frame length so far, the checksum total, the member checks (outside the level, the whole
        level, how many); the slot table reads C1's slot on the same edge."""
        i1, c1, c2, adv = self.i1, self.c1, self.c2, self.classified.advance
        frame_len = (i1.idx << ceil_log2(self.data_width)) + i1.bytes
        with m.If(adv & i1.hdr_end):
            m.d.sync += [
                c2.eq(c1),
                c2.runt.eq(i1.last & (frame_len < MIN_FRAME_BYTES)),
                c2.header_short.eq(i1.last & (frame_len < FRAME_HEADER_BYTES)),
                c2.request_len_ok.eq(i1.last & (frame_len == FRAME_HEADER_BYTES)),
                c2.csum_total.eq(c1.csum_a + c1.csum_b + c1.csum_c),
                # DROP_SENDER also for members outside the level, or a level member not below the fan-in.
                c2.sender_bad.eq(c1.sender_bad | c1.level_outside | self.outside_level(c1)),
                c2.members_full.eq(c1.members == c1.level),
                c2.member_count.eq(popcount(c1.members)),
                c2.member_bad.eq(self.source_bad(c1)),
            ]
        m.d.comb += [self.member_query.hit.eq(c1.hit), self.member_query.address.eq(c1.ip_src),
                     self.member_query.port.eq(c1.udp_sport)]
        lookup = self.lookup
        m.d.comb += [lookup.read.eq(adv), lookup.addr.eq(c1.slot[:self.slot_bits]), lookup.load.eq(adv & i1.hdr_end),
                     lookup.compare.eq(adv & self.i2.hdr_end)]
        m.d.comb += [getattr(lookup.key, name).eq(getattr(c2, name)) for name in SLOT_KEY.members]

    def outside_level(self, c1):
        """Whether the frame in C1 holds a member outside its level (a result from the parent, with routes,
        holds the whole clique: `level_outside` checks it)."""
        outside = (c1.members & ~c1.level).any()
        return ~c1.v3_result & outside if self.routes else outside

    def source_bad(self, c1):
        """Whether the version 3 frame in C1 comes from where its job's tables do not allow (`member_query`
        answers for C1's frame): a contribution, result request or stats request comes from a member; a
        partial from a child aggregator of its clique's route holding none but that child's members
        (`child_ok`, with children in the tables); a result from the clique's parent (`hop1` and
        `parent_port` for a route with one). A subclass may check otherwise (inwire_hdl.mutants)."""
        if self.routes:
            from_parent = c1.partial_out & (c1.ip_src == c1.hop1) & (c1.udp_sport == c1.parent_port)
            from_child = c1.child_ok if self.children else Const(0)
            return c1.v3 & Mux(c1.v3_result, ~from_parent,
                               Mux(c1.partial, ~from_child, ~self.member_query.member_ok))
        return c1.v3 & (c1.partial | c1.v3_result | ~self.member_query.member_ok)

    def _classify_checks(self, m):
        """C3: the checks in the model's order up to the slot table, registered with C2."""
        c2, c3 = self.c2, self.classified.frame
        once = c2.csum_total[:16] + c2.csum_total[16:]
        csum_ok = Mux(once[16], once[:16] == 0xFFFE, once[:16] == 0xFFFF)
        pre_disp, pre_action, pre_pass = Signal(Disposition), Signal(Action), Signal()
        len_pending = Signal()

        def pre(disposition, action=Action.DROP):
            m.d.comb += [pre_disp.eq(disposition), pre_action.eq(action)]

        with m.If(c2.runt):
            pre(Disposition.DROP_RUNT)
        with m.Elif(c2.foreign):
            pre(Disposition.FORWARDED, Action.FORWARD)
        with m.Elif(c2.bad_ver):
            pre(Disposition.DROP_IP_HEADER)
        with m.Elif(c2.frag):
            pre(Disposition.DROP_IP_FRAGMENT)
        with m.Elif(~csum_ok):
            pre(Disposition.DROP_IP_CHECKSUM)
        with m.Elif(c2.header_short):
            pre(Disposition.DROP_LENGTH)
        with m.Elif(c2.bad_magic):
            pre(Disposition.DROP_VERSION)
        with m.Elif(~c2.summed & ~c2.result_req & ~c2.stats_req & ~c2.v3_result):
            pre(Disposition.DROP_OPCODE)
        with m.Elif(c2.lengths_bad | (~c2.payload & ~c2.request_len_ok)):
            pre(Disposition.DROP_LENGTH)
        with m.Else():
            # From here on the frame length of a frame with elements is still to be checked beat by beat.
            m.d.comb += len_pending.eq(c2.payload)
            # The checks after the lengths, in the model's order (`FRAME_CHECKS`): the first that applies decides.
            checks = [(c2.job_bad, Disposition.DROP_JOB), (c2.token_bad, Disposition.DROP_TOKEN),
                      (c2.member_bad, Disposition.DROP_MEMBER), (c2.stats_req, Disposition.ANSWERED, Action.STATS),
                      (c2.fanin_bad, Disposition.DROP_FANIN), (c2.sender_bad, Disposition.DROP_SENDER),
                      (c2.count_bad, Disposition.DROP_COUNT), (c2.group_bad, Disposition.DROP_GROUP),
                      (c2.slot_bad, Disposition.DROP_SLOT), (c2.route_bad, Disposition.DROP_ROUTE)]
            for index, (applies, *outcome) in enumerate(checks):
                with (m.If if index == 0 else m.Elif)(applies):
                    pre(*outcome)
            with m.Else():
                m.d.comb += pre_pass.eq(1)
        with m.If(self.classified.advance & self.i2.hdr_end):
            m.d.sync += [c3.eq(c2), c3.pre_disp.eq(pre_disp), c3.pre_action.eq(pre_action), c3.pre_pass.eq(pre_pass),
                         c3.len_pending.eq(len_pending)]
