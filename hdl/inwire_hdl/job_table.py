"""The job tables: what a control plane installs for each registered job, and the register map it writes them
through (docs/board.md, Job tables).

Each of `limits.jobs` entries holds a job id, its 64-bit token, its slot range (first slot and quota), its
multicast group, `limits.members` member endpoints (IPv4 address and UDP port) and `limits.routes` clique
routes (the clique, the members this aggregator gathers of it, the parent its partial goes to, and
`limits.children` child aggregators whose partials it takes, each with the members they may hold). They
are registers, so that every entry is compared with a frame at once: the header classifier asks which entry
holds the frame's job and whether its token, group, slot and source are that job's (`query`,
`member_query`). Writes come from the board's management side through `control` (one 32-bit word a cycle);
nothing a frame carries writes them.

The register map (`ControlMap`) is the only place the word addresses are defined; `ControlMap.install` and
`ControlMap.remove` turn a golden-model job table's change into the writes that make the gateware hold the
same, in an order that never shows a frame a half-written entry as valid; `control_records` frames those
writes for a board's management port (`board_control`).
"""

from dataclasses import dataclass

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import crc, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from inwire.jobs import JobEntry, JobLimits, check_fits

GATEWARE_LIMITS = JobLimits(jobs=4, members=8, routes=0, children=0, unicast_results=False)
"""What the gateware's job tables hold unless a configuration says otherwise: jobs with a multicast group and
flat cliques rooted here (results go to the group, one frame each). The Versa's core is built with these."""

TREE_LIMITS = JobLimits(jobs=4, members=8, routes=2, children=2, unicast_results=False)
"""Tables that also hold two clique routes per job, each with two child aggregators: the gateware in a
registered tree takes its children's partials, sends its level's partial to the parent (none at the root)
and relays the result that comes back down to the group."""

MAX_GATEWARE_JOBS = 16
MAX_GATEWARE_MEMBERS = 32
MAX_GATEWARE_ROUTES = 8
MAX_GATEWARE_CHILDREN = 4
"""Above these the comparators (every entry against every frame) outgrow an ECP5's fabric."""

JOB_WORDS = ("job", "token_low", "token_high", "base", "quota", "group", "valid")
"""The words of one job entry, in address order; its members follow, two words each (address, port | valid)."""
JOB_WORD_MEANING = {
    "job": "job id",
    "token_low": "token, bits 0 to 31",
    "token_high": "token, bits 32 to 63",
    "base": "first slot of the job's range",
    "quota": "slots in the range (the job's frames name slots 0 to quota - 1)",
    "group": "multicast group results go to (IPv4 address)",
    "valid": "bit 0: the entry holds a job (written 0 first and 1 last)",
}
ROUTE_WORDS = ("clique", "level_low", "level_high", "parent_address", "parent_port")
"""The words of one clique route, in address order; an entry's routes follow its members."""
ROUTE_WORD_MEANING = {
    "clique": "bits 0 to 15: the clique the route is for; bit 16: the route is valid",
    "level_low": "level, bits 0 to 31: the clique's members gathered here (a level of 0: the whole clique)",
    "level_high": "level, bits 32 to 63",
    "parent_address": "IPv4 address of the aggregator the level's partial goes to",
    "parent_port": "bits 0 to 15: the parent's UDP port; bit 16: the clique has a parent (0: rooted here)",
}
CHILD_WORDS = ("child_address", "child_members_low", "child_members_high", "child_port")
"""The words of one child aggregator of a route, in address order; a route's children follow its words."""
CHILD_WORD_MEANING = {
    "child_address": "IPv4 address of the child aggregator",
    "child_members_low": "bits 0 to 31 of the members the child's partials may hold",
    "child_members_high": "bits 32 to 63 of those members",
    "child_port": "bits 0 to 15: the child's UDP port; bit 16: the child is valid",
}


def check_limits(limits):
    """Refuse job limits the gateware cannot hold, in one line."""
    if not 1 <= limits.jobs <= MAX_GATEWARE_JOBS or not 1 <= limits.members <= MAX_GATEWARE_MEMBERS:
        raise ValueError(f"the gateware holds 1 to {MAX_GATEWARE_JOBS} jobs of 1 to {MAX_GATEWARE_MEMBERS} members, "
                         f"got {limits.jobs} jobs of {limits.members}")
    if not 0 <= limits.routes <= MAX_GATEWARE_ROUTES:
        raise ValueError(f"the gateware holds 0 to {MAX_GATEWARE_ROUTES} routes per job, got {limits.routes}")
    if not 0 <= limits.children <= (MAX_GATEWARE_CHILDREN if limits.routes else 0):
        raise ValueError(f"the gateware holds 0 to {MAX_GATEWARE_CHILDREN} child aggregators per route (none "
                         f"without routes), got {limits.children} with {limits.routes} routes")
    if limits.unicast_results:
        raise ValueError("the gateware holds no job without a group: build it with JobLimits(unicast_results=False)")


@dataclass(frozen=True)
class ControlMap:
    """Word addresses of the control interface for `jobs` entries of `members` members and `routes` clique
    routes each, each route with `children` child aggregators."""

    jobs: int
    members: int
    routes: int = 0
    children: int = 0

    @property
    def route_stride(self):
        """Words per route: its own, then its children's."""
        return len(ROUTE_WORDS) + len(CHILD_WORDS) * self.children

    @property
    def stride(self):
        """Words per job entry (a power of two: an entry's index is the address's upper bits)."""
        return 1 << ceil_log2(len(JOB_WORDS) + 2 * self.members + self.route_stride * self.routes)

    @property
    def clear_address(self):
        """Writing a slot index here empties that slot (a job's range is emptied when it is installed or torn
        down, as the golden model's `install` and `remove` do)."""
        return self.jobs * self.stride

    @property
    def address_bits(self):
        return ceil_log2(self.clear_address + 1)

    def word(self, index, name):
        return index * self.stride + JOB_WORDS.index(name)

    def member_words(self, index, member):
        """(address word, port word) of member `member` of entry `index`."""
        first = index * self.stride + len(JOB_WORDS) + 2 * member
        return first, first + 1

    def route_word(self, index, route, name):
        """The address of word `name` (`ROUTE_WORDS`) of route `route` of entry `index`."""
        first = index * self.stride + len(JOB_WORDS) + 2 * self.members + self.route_stride * route
        return first + ROUTE_WORDS.index(name)

    def child_word(self, index, route, child, name):
        """The address of word `name` (`CHILD_WORDS`) of child `child` of route `route` of entry `index`."""
        first = self.route_word(index, route, ROUTE_WORDS[0]) + len(ROUTE_WORDS) + len(CHILD_WORDS) * child
        return first + CHILD_WORDS.index(name)

    def install(self, index, entry: JobEntry, base, new):
        """The writes that make entry `index` hold `entry` (at first slot `base`); `new`: the job was not
        installed before, so its range is emptied. The entry is invalid while it is written (its members and
        routes with it), valid before its range is emptied (a version 1 or 2 frame can then no longer claim a
        slot of it). Routes go in clique order, their children in endpoint order; the unused ones are
        written invalid."""
        check_fits(entry, JobLimits(self.jobs, self.members, self.routes, self.children))
        writes = [(self.word(index, "valid"), 0),
                  (self.word(index, "job"), entry.job),
                  (self.word(index, "token_low"), entry.token & 0xFFFFFFFF),
                  (self.word(index, "token_high"), entry.token >> 32),
                  (self.word(index, "base"), base),
                  (self.word(index, "quota"), entry.slots),
                  (self.word(index, "group"), entry.group)]
        endpoints = sorted(entry.members)
        for member in range(self.members):
            address_word, port_word = self.member_words(index, member)
            if member < len(endpoints):
                address, port = endpoints[member]
                writes += [(address_word, address), (port_word, port | 1 << 16)]
            else:
                writes.append((port_word, 0))
        routes = sorted(entry.routes.items())
        for position in range(self.routes):
            def at(name, position=position):
                return self.route_word(index, position, name)

            if position < len(routes):
                clique, route = routes[position]
                address, port = route.parent or (0, 0)
                up = route.parent is not None
                writes += [(at("level_low"), route.level & 0xFFFFFFFF), (at("level_high"), route.level >> 32),
                           (at("parent_address"), address), (at("parent_port"), port | up << 16)]
                writes += self._children(index, position, sorted(route.children.items()))
                writes.append((at("clique"), clique | 1 << 16))
            else:
                writes.append((at("clique"), 0))
        writes.append((self.word(index, "valid"), 1))
        if new:
            writes += [(self.clear_address, slot) for slot in range(base, base + entry.slots)]
        return writes

    def _children(self, index, route, children):
        """The writes of route `route`'s child words for `children` [(endpoint, members)], the rest invalid."""
        writes = []
        for position in range(self.children):
            def at(name, position=position):
                return self.child_word(index, route, position, name)

            if position < len(children):
                (address, port), members = children[position]
                writes += [(at("child_address"), address), (at("child_members_low"), members & 0xFFFFFFFF),
                           (at("child_members_high"), members >> 32), (at("child_port"), port | 1 << 16)]
            else:
                writes.append((at("child_port"), 0))
        return writes

    def markdown(self):
        """The register map as a Markdown table (docs/board.md, Job tables)."""
        rows = [f"| {self.stride}·e + {offset} | `{name}` | {JOB_WORD_MEANING[name]} |"
                for offset, name in enumerate(JOB_WORDS)]
        first = len(JOB_WORDS)
        rows += [f"| {self.stride}·e + {first} + 2·m | member m address | IPv4 address member m sends from |",
                 f"| {self.stride}·e + {first + 1} + 2·m | member m port | bits 0 to 15: its UDP port; bit 16: the "
                 f"member is valid |"]
        first += 2 * self.members
        if self.routes:
            rows += [f"| {self.stride}·e + {first + offset} + {self.route_stride}·r | `{name}` | "
                     f"{ROUTE_WORD_MEANING[name]} |" for offset, name in enumerate(ROUTE_WORDS)]
        first += len(ROUTE_WORDS)
        if self.children:
            rows += [f"| {self.stride}·e + {first + offset} + {self.route_stride}·r + {len(CHILD_WORDS)}·c | `{name}` "
                     f"| {CHILD_WORD_MEANING[name]} |" for offset, name in enumerate(CHILD_WORDS)]
        rows.append(f"| {self.clear_address} | clear | writing a slot index empties that slot |")
        routes = f"; r: route, 0 to {self.routes - 1}" if self.routes else ""
        routes += f"; c: child, 0 to {self.children - 1}" if self.children else ""
        return "\n".join([f"e: entry, 0 to {self.jobs - 1}; m: member, 0 to {self.members - 1}{routes}; "
                          f"{self.address_bits} address bits.", "", "| address | word | contents |",
                          "|---|---|---|", *rows])

    def remove(self, index, base, slots):
        """The writes that tear entry `index` down and empty its range (first slot `base`, `slots` long)."""
        return [(self.word(index, "valid"), 0)] + [(self.clear_address, slot) for slot in range(base, base + slots)]

    def forget(self, index, positions):
        """The writes that invalidate members `positions` of entry `index` (members leaving: the entry stays
        valid, its other members where they are)."""
        return [(self.member_words(index, position)[1], 0) for position in positions]


RECORD_SYNC = 0xA5
"""First byte of every control record (docs/board.md, Management port)."""
RECORD_BYTES = 8
"""A record: the sync byte, the 16-bit address, the 32-bit word (both big endian), the check byte."""
RECORD_CHECK = crc.catalog.CRC8_AUTOSAR(data_width=8)
"""The check byte: CRC-8/AUTOSAR of the six address and word bytes (any error of up to 3 bits in them is
caught; an initial value of 0xFF gives the all-zero filler no valid check byte)."""
RECORD_PREAMBLE = bytes(RECORD_BYTES - 1)
"""Sent before the records: a receiver that locked onto a false sync byte (line noise, a record cut short)
takes at most 7 more bytes before it fails the check and hunts again, so it is hunting before the first
real sync byte."""


def control_records(writes):
    """The bytes that carry control writes [(address, word), ...] to a board's management port: the
    preamble, then one record per write, in order."""
    records = [RECORD_PREAMBLE]
    for address, word in writes:
        if not 0 <= address <= 0xFFFF:
            raise ValueError(f"control address {address}: a record carries 16 bits")
        if not 0 <= word <= 0xFFFFFFFF:
            raise ValueError(f"control word {word} at address {address}: a record carries 32 bits")
        payload = address.to_bytes(2, "big") + word.to_bytes(4, "big")
        records.append(bytes([RECORD_SYNC]) + payload + bytes([RECORD_CHECK.compute(payload)]))
    return b"".join(records)


class GatewareJobs:
    """The host's record of which entry of the gateware's tables holds which job, beside a golden model's
    `Aggregator` holding the same jobs: `install`, `leave` and `remove` change the model and return the control
    writes that change the gateware alike."""

    def __init__(self, model):
        limits = model.config.limits
        self.model = model
        self.map = ControlMap(limits.jobs, limits.members, limits.routes, limits.children)
        self.index = {}
        """job -> its entry."""
        self.layout = {}
        """job -> the member endpoint at each position of its entry (None where one left)."""

    def install(self, entry: JobEntry):
        new = entry.job not in self.index
        base = self.model.install(entry)
        if new:
            self.index[entry.job] = min(set(range(self.map.jobs)) - set(self.index.values()))
        installed = self.model.jobs.entries[entry.job]
        self.layout[entry.job] = sorted(installed.members)
        return self.map.install(self.index[entry.job], installed, base, new)

    def leave(self, job, members):
        """`members` leave `job`, as the model's `leave`: (the writes, how many were members, how many remain);
        the last member's leave removes the job."""
        if job not in self.index:
            return [], 0, 0
        base, slots = self.model.jobs.bases[job], self.model.jobs.entries[job].slots
        left, remaining = self.model.leave(job, members)
        if not remaining:
            self.layout.pop(job)
            return self.map.remove(self.index.pop(job), base, slots), left, remaining
        leaving = set(members)
        positions = [position for position, member in enumerate(self.layout[job]) if member in leaving]
        for position in positions:
            self.layout[job][position] = None
        return self.map.forget(self.index[job], positions), left, remaining

    def remove(self, job):
        if job not in self.index:
            return []
        base, slots = self.model.jobs.bases[job], self.model.jobs.entries[job].slots
        self.model.remove(job)
        self.layout.pop(job)
        return self.map.remove(self.index.pop(job), base, slots)


def control_signature(address_bits):
    """The management side to the job tables: one 32-bit word `data` written at `addr` while `we`."""
    return wiring.Signature({"we": Out(1), "addr": Out(address_bits), "data": Out(32)})


def query_signature(jobs, slot_bits, routes=0, children=0):
    """Classifier to job tables, combinational from a frame's header: per entry, whether it holds the frame's
    job (`hit`) and whether the frame's token, group and slot are within it; the first slot of the entry
    that hits (`base`); whether the slot lies in any valid entry's range (`in_range`). With `routes`, the
    route of the frame's `clique` in the entry that hits: whether there is one (`routed`), its `level`, and
    whether it has a parent (`up`) and its endpoint (`parent`, `parent_port`). With `children`, whether the
    frame's source (`address`, `port`) is a child aggregator of that route and its `members` are within the
    child's (`child_ok`)."""
    members = {
        "job": Out(32), "token": Out(64), "group": Out(32), "slot": Out(16),
        "hit": In(jobs), "token_ok": In(jobs), "group_ok": In(jobs), "quota_ok": In(jobs),
        "base": In(slot_bits), "in_range": In(1),
    }
    if routes:
        members.update({"clique": Out(16), "routed": In(1), "level": In(64), "up": In(1), "parent": In(32),
                        "parent_port": In(16)})
    if children:
        members.update({"address": Out(32), "port": Out(16), "members": Out(64), "child_ok": In(1)})
    return wiring.Signature(members)


def member_query_signature(jobs):
    """Classifier to job tables, a stage later: whether the frame's source is a member of the entry that hit."""
    return wiring.Signature({"hit": Out(jobs), "address": Out(32), "port": Out(16), "member_ok": In(1)})


def clear_signature(slot_bits):
    """Job tables to slot table: empty slot `slot` while `valid`."""
    return wiring.Signature({"valid": Out(1), "slot": Out(slot_bits)})


class JobTables(wiring.Component):
    """The job tables of `config.limits` (see the module's docstring)."""

    def __init__(self, config):
        limits = config.limits
        check_limits(limits)
        self.jobs, self.members, self.routes = limits.jobs, limits.members, limits.routes
        self.children = limits.children
        self.map = ControlMap(limits.jobs, limits.members, limits.routes, limits.children)
        self.slot_bits = max(1, ceil_log2(config.slots))
        super().__init__({
            "control": In(control_signature(self.map.address_bits)),
            "query": In(query_signature(self.jobs, self.slot_bits, self.routes, self.children)),
            "member_query": In(member_query_signature(self.jobs)),
            "clear": Out(clear_signature(self.slot_bits)),
        })

    def elaborate(self, platform):
        m = Module()
        ctl, query, members_q = self.control, self.query, self.member_query
        stride = self.map.stride
        entry_bits = ceil_log2(stride)
        index, offset = ctl.addr[entry_bits:], ctl.addr[:entry_bits]
        hits, token_oks, group_oks, quota_oks, in_ranges, member_oks, bases = [], [], [], [], [], [], []
        routes = []
        for entry in range(self.jobs):
            valid, job, token, group = Signal(name=f"valid{entry}"), Signal(32, name=f"job{entry}"), \
                Signal(64, name=f"token{entry}"), Signal(32, name=f"group{entry}")
            base, quota = Signal(self.slot_bits, name=f"base{entry}"), Signal(17, name=f"quota{entry}")
            # The range's end, kept beside base and quota so that the range check is two comparisons.
            end = Signal(18, name=f"end{entry}")
            written = ctl.we & (index == entry)

            def at(name, offset=offset, written=written):
                return written & (offset == JOB_WORDS.index(name))

            with m.If(at("valid")):
                m.d.sync += valid.eq(ctl.data[0])
            with m.If(at("job")):
                m.d.sync += job.eq(ctl.data)
            with m.If(at("token_low")):
                m.d.sync += token[:32].eq(ctl.data)
            with m.If(at("token_high")):
                m.d.sync += token[32:].eq(ctl.data)
            with m.If(at("group")):
                m.d.sync += group.eq(ctl.data)
            with m.If(at("base")):
                m.d.sync += [base.eq(ctl.data), end.eq(ctl.data[:self.slot_bits] + quota)]
            with m.If(at("quota")):
                m.d.sync += [quota.eq(ctl.data), end.eq(base + ctl.data[:17])]
            entry_members = []
            for member in range(self.members):
                address, port, member_valid = (Signal(32, name=f"member{entry}_{member}_address"),
                                               Signal(16, name=f"member{entry}_{member}_port"),
                                               Signal(name=f"member{entry}_{member}_valid"))
                address_word, port_word = (word - entry * stride for word in self.map.member_words(entry, member))
                with m.If(written & (offset == address_word)):
                    m.d.sync += address.eq(ctl.data)
                with m.If(written & (offset == port_word)):
                    m.d.sync += [port.eq(ctl.data[:16]), member_valid.eq(ctl.data[16])]
                entry_members.append(member_valid & (address == members_q.address) & (port == members_q.port))
            if self.routes:
                routes.append(self._routes(m, entry, written, offset, valid & (job == query.job)))
            hits.append(valid & (job == query.job))
            token_oks.append(token == query.token)
            group_oks.append(group == query.group)
            quota_oks.append(query.slot < quota)
            in_ranges.append(valid & (query.slot >= base) & (query.slot < end))
            member_oks.append(members_q.hit[entry] & Cat(*entry_members).any())
            bases.append(base)
        # At most one valid entry holds a job (the model refuses a second), so the hits' bases are or'ed.
        base_of_hit = 0
        for hit, base in zip(hits, bases, strict=True):
            base_of_hit = base_of_hit | Mux(hit, base, 0)
        m.d.comb += [
            query.hit.eq(Cat(*hits)), query.token_ok.eq(Cat(*token_oks)), query.group_ok.eq(Cat(*group_oks)),
            query.quota_ok.eq(Cat(*quota_oks)), query.in_range.eq(Cat(*in_ranges).any()), query.base.eq(base_of_hit),
            members_q.member_ok.eq(Cat(*member_oks).any()),
        ]
        if self.routes:
            # At most one route of the entry that hits names the frame's clique (the model's routes are a
            # mapping by clique), so the matches' fields are or'ed.
            for name in ("routed", "level", "up", "parent", "parent_port") + (("child_ok",) if self.children else ()):
                value = 0
                for matches in routes:
                    for match, fields in matches:
                        value = value | Mux(match, fields[name], 0)
                m.d.comb += getattr(query, name).eq(value)
        clear_now = ctl.we & (ctl.addr == self.map.clear_address)
        m.d.sync += [self.clear.valid.eq(clear_now), self.clear.slot.eq(ctl.data[:self.slot_bits])]
        return m

    def _routes(self, m, entry, written, offset, hit):
        """The route registers of entry `entry`, written through `control`: [(whether the route is valid,
        names the frame's clique and its entry `hit`s, its fields)] per route."""
        matches = []
        for route in range(self.routes):
            clique, valid, level, parent, parent_port, up = (
                Signal(16, name=f"route{entry}_{route}_clique"), Signal(name=f"route{entry}_{route}_valid"),
                Signal(64, name=f"route{entry}_{route}_level"), Signal(32, name=f"route{entry}_{route}_parent"),
                Signal(16, name=f"route{entry}_{route}_parent_port"), Signal(name=f"route{entry}_{route}_up"))

            def at(name, route=route):
                return written & (offset == self.map.route_word(entry, route, name) - entry * self.map.stride)

            with m.If(at("clique")):
                m.d.sync += [clique.eq(self.control.data[:16]), valid.eq(self.control.data[16])]
            with m.If(at("level_low")):
                m.d.sync += level[:32].eq(self.control.data)
            with m.If(at("level_high")):
                m.d.sync += level[32:].eq(self.control.data)
            with m.If(at("parent_address")):
                m.d.sync += parent.eq(self.control.data)
            with m.If(at("parent_port")):
                m.d.sync += [parent_port.eq(self.control.data[:16]), up.eq(self.control.data[16])]
            fields = {"routed": 1, "level": level, "up": up, "parent": parent, "parent_port": parent_port}
            if self.children:
                fields["child_ok"] = self._children(m, entry, route, written, offset)
            matches.append((hit & valid & (clique == self.query.clique), fields))
        return matches

    def _children(self, m, entry, route, written, offset):
        """The child registers of route `route` of entry `entry`: whether the frame's source is one of them
        and its members within that child's."""
        query, oks = self.query, []
        for child in range(self.children):
            name = f"child{entry}_{route}_{child}"
            address, port, valid, members = (Signal(32, name=f"{name}_address"), Signal(16, name=f"{name}_port"),
                                             Signal(name=f"{name}_valid"), Signal(64, name=f"{name}_members"))

            def at(word, child=child):
                return written & (offset == self.map.child_word(entry, route, child, word) - entry * self.map.stride)

            with m.If(at("child_address")):
                m.d.sync += address.eq(self.control.data)
            with m.If(at("child_members_low")):
                m.d.sync += members[:32].eq(self.control.data)
            with m.If(at("child_members_high")):
                m.d.sync += members[32:].eq(self.control.data)
            with m.If(at("child_port")):
                m.d.sync += [port.eq(self.control.data[:16]), valid.eq(self.control.data[16])]
            oks.append(valid & (address == query.address) & (port == query.port) & ((query.members & ~members) == 0))
        return Cat(*oks).any()
