"""What a control plane installs at an aggregator for a job: the tables its data plane trusts.

A version 3 frame (`protocol.JOB_VERSION`) counts only at an aggregator that holds its job: the frame's
token must equal the job's, its source must be one of the job's members (a contribution or result request),
a child aggregator of its clique (a partial) or the clique's parent (a result coming down a tree), and its
slot must lie within the job's quota. Everything the aggregator sends goes to an address from these tables:
the job's multicast group, its members, the clique's parent and children. The frame names none of them.

The tables are bounded (`JobLimits`), so that no registration can grow an aggregator without bound, and
each job's slots are a range of its own (`JobTable.install` allocates it), so that one job's traffic can
never claim, read or evict another job's slots.
"""

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from .errors import InwireError
from .protocol import MAX_FANIN, clique_mask, is_multicast_group

Endpoint = tuple[int, int]
"""(IPv4 address as an int, UDP port)."""

TOKEN_BITS = 64
JOB_BITS = 32


class JobTableError(InwireError):
    """A registration the aggregator refuses; the message is one line naming the cause."""


@dataclass(frozen=True)
class CliqueRoute:
    """One clique's place at this aggregator in its reduction tree. A clique the job names no route for is
    a flat clique rooted here: this aggregator gathers all of it and sends the result down."""

    level: int = 0
    """Bitmap of the clique's members this aggregator gathers (its own members and its children's); 0: all."""
    parent: Endpoint | None = None
    """The aggregator this one sends its level's partial to; None at the root."""
    children: Mapping[Endpoint, int] = field(default_factory=lambda: MappingProxyType({}))
    """Child aggregator -> bitmap of the members its partials may hold."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "children", MappingProxyType(dict(self.children)))

    def __deepcopy__(self, memo: dict) -> "CliqueRoute":
        return self  # immutable: a copied aggregator shares it

    def resolved_level(self, fanin: int) -> int:
        return self.level or clique_mask(fanin)


FLAT = CliqueRoute()


class TreeError(JobTableError):
    """A clique's reduction tree from which no tables can be built; the message is one line naming the cause."""


def tree_routes(root: str, tree: Mapping[str, str] | None, members: Mapping[Endpoint, tuple[str, int]],
                aggregators: Mapping[str, Endpoint], where: str = "tree") -> dict[str, CliqueRoute]:
    """city -> the CliqueRoute its aggregator holds for one clique summed along `tree` ({city: up}, the
    schedule's format, docs/schedule.md) to the clique's aggregator city `root`. `members` maps each member's
    endpoint to (the city whose aggregator it sends to, its index in the clique: 0 to n - 1, each once);
    `aggregators` maps a city to its aggregator's endpoint. The tree's aggregators are the cities members send
    to and every city above them: each gathers the members at and below it (`level`), sends its partial to
    its parent's aggregator (none at the root) and takes partials from the aggregators just below it, each
    holding that child's level. The tables carry the route, not the frames, so the depth is not capped. A
    tree city with no member at or below it gets no route (it needs no aggregator). `where` begins each error
    message."""
    parents = dict(tree or {})
    if root in parents:
        raise TreeError(f"{where}: it gives the root {root} a parent ({parents[root]}); the root has none")
    for city in parents:
        _path_to_root(city, root, parents, where)
    indices = sorted(index for _, index in members.values())
    if indices != list(range(len(members))) or len(members) > MAX_FANIN:
        raise TreeError(f"{where}: the members' indices {indices} are not 0 to {len(members) - 1}, each once "
                        f"(a clique of at most {MAX_FANIN})")
    level: dict[str, int] = {}
    for endpoint, (city, index) in members.items():
        if city != root and city not in parents:
            raise TreeError(f"{where}: member {_show(endpoint)} sends to {city}, which is under no aggregator: "
                            f"neither the root {root} nor a city of the tree")
        for step in _path_to_root(city, root, parents, where):
            level[step] = level.get(step, 0) | 1 << index
    missing = sorted(city for city in level if city not in aggregators)
    if missing:
        raise TreeError(f"{where}: {', '.join(missing)} gather{'s' if len(missing) == 1 else ''} members but "
                        f"{'has' if len(missing) == 1 else 'have'} no aggregator address")
    shared: dict[Endpoint, str] = {}
    for city in sorted(level):
        other = shared.setdefault(aggregators[city], city)
        if other != city:
            raise TreeError(f"{where}: {other} and {city} name one aggregator, {_show(aggregators[city])}; each "
                            f"level of a tree needs its own")
    children: dict[str, dict[Endpoint, int]] = {city: {} for city in level}
    for city in level:
        if city != root:
            children[parents[city]][aggregators[city]] = level[city]
    return {city: CliqueRoute(level=level[city], parent=None if city == root else aggregators[parents[city]],
                              children=children[city]) for city in level}


def _path_to_root(city: str, root: str, parents: Mapping[str, str], where: str) -> list[str]:
    """The cities from `city` up to `root`, both included, by `parents`; a loop or a dead end is a TreeError."""
    path = [city]
    while path[-1] != root:
        up = parents.get(path[-1])
        if up is None:
            raise TreeError(f"{where}: {' -> '.join(path)} does not reach the root {root}: {path[-1]} has no "
                            f"parent")
        if up in path:
            raise TreeError(f"{where}: a cycle, {' -> '.join(path[path.index(up):] + [up])}, that never reaches "
                            f"the root {root}")
        path.append(up)
    return path


@dataclass(frozen=True)
class JobLimits:
    """How much one aggregator's tables hold."""

    jobs: int = 16
    members: int = 256
    """Member addresses per job."""
    routes: int = 1024
    """Cliques with a route of their own, per job."""
    children: int = MAX_FANIN
    """Child aggregators per route: each holds at least one member of a clique of at most MAX_FANIN."""
    unicast_results: bool = True
    """Whether a job without a group may be installed: its results go out as one copy per member address.
    An aggregator that sends one frame per result (the gateware) holds only jobs with a group."""


@dataclass(frozen=True)
class JobEntry:
    """A job as one aggregator holds it."""

    job: int
    token: int
    slots: int
    """Quota: the job's frames name slots 0 to slots - 1, a range of the aggregator's own."""
    members: frozenset[Endpoint]
    """Where the job's members send from, and where unicast results go."""
    group: int = 0
    """IPv4 multicast group results go to, in 239.0.0.0/8; 0: each member gets a unicast copy."""
    routes: Mapping[int, CliqueRoute] = field(default_factory=lambda: MappingProxyType({}))
    """clique -> its route here; a clique not named is flat and rooted here."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "members", frozenset(self.members))
        object.__setattr__(self, "routes", MappingProxyType(dict(self.routes)))
        if not 0 < self.job < 1 << JOB_BITS:
            raise JobTableError(f"job id {self.job} is not a nonzero {JOB_BITS}-bit number")
        if not 0 < self.token < 1 << TOKEN_BITS:
            raise JobTableError(f"job {self.job}: its token is not a nonzero {TOKEN_BITS}-bit number")
        if self.slots < 1:
            raise JobTableError(f"job {self.job}: a quota of {self.slots} slots holds nothing")
        if self.group and not is_multicast_group(self.group):
            raise JobTableError(f"job {self.job}: group {self.group:#x} is not in 239.0.0.0/8")
        for endpoint in self.members:
            _check_endpoint(self.job, "member", endpoint)
        for clique, route in self.routes.items():
            if not 0 <= clique < 1 << 16:
                raise JobTableError(f"job {self.job}: clique {clique} does not fit the 16-bit clique field")
            if route.level & ~clique_mask(MAX_FANIN):
                raise JobTableError(f"job {self.job}, clique {clique}: level {route.level:#x} has members beyond "
                                    f"{MAX_FANIN}")
            if route.parent is not None:
                _check_endpoint(self.job, "parent", route.parent)
            for child, members in route.children.items():
                _check_endpoint(self.job, "child", child)
                level = route.level or clique_mask(MAX_FANIN)
                if not members or members & ~level:
                    raise JobTableError(f"job {self.job}, clique {clique}: child {_show(child)} holds members "
                                        f"{members:#x}, none or outside the level {level:#x}")

    def __deepcopy__(self, memo: dict) -> "JobEntry":
        return self  # immutable: a copied aggregator shares it

    def route(self, clique: int) -> CliqueRoute:
        return self.routes.get(clique, FLAT)


def _check_endpoint(job: int, what: str, endpoint: Endpoint) -> None:
    address, port = endpoint
    if not (0 < address < 1 << 32 and 0 < port < 1 << 16) or is_multicast_group(address):
        raise JobTableError(f"job {job}: {what} {_show(endpoint)} is not a unicast IPv4 address and port")


def _show(endpoint: Endpoint) -> str:
    address, port = endpoint
    if not 0 <= address < 1 << 32:
        return f"{address}:{port}"
    return f"{'.'.join(str(address >> shift & 0xFF) for shift in (24, 16, 8, 0))}:{port}"



def check_fits(entry: JobEntry, limits: JobLimits) -> None:
    """Refuse, in one line (JobTableError), an entry that one job's share of tables of `limits` cannot hold:
    too many members, routes or child aggregators of a route, or no group where results cannot be copied."""
    if len(entry.members) > limits.members:
        raise JobTableError(f"job {entry.job}: {len(entry.members)} members, more than the {limits.members} "
                            f"an aggregator holds per job")
    if not entry.group and not limits.unicast_results:
        raise JobTableError(f"job {entry.job}: without a group its results go out as one copy per member, "
                            f"which this aggregator cannot send: give the job a multicast group")
    crowded = next((clique for clique, route in entry.routes.items() if len(route.children) > limits.children),
                   None)
    if crowded is not None:
        raise JobTableError(f"job {entry.job}, clique {crowded}: {len(entry.routes[crowded].children)} child "
                            f"aggregators, more than the {limits.children} a route holds")
    if len(entry.routes) > limits.routes:
        raise JobTableError(f"job {entry.job}: {len(entry.routes)} routes, more than the {limits.routes} an "
                            f"aggregator holds per job")

class JobTable:
    """The jobs one aggregator holds, each with its range of the aggregator's `slots`."""

    def __init__(self, slots: int, limits: JobLimits | None = None) -> None:
        self.slots = slots
        self.limits = limits or JobLimits()
        self.entries: dict[int, JobEntry] = {}
        self.bases: dict[int, int] = {}
        """job -> the first aggregator slot of its range."""

    def install(self, entry: JobEntry) -> int:
        """Install `entry`; returns the first slot of its range. Installing a job that is installed with the
        same token, quota, group and routes adds `entry`'s members to it (each island may register its own
        socket; doing it again changes nothing). A job id installed with anything else is refused: a clash."""
        held = self.entries.get(entry.job)
        if held is not None:
            if replace(held, members=entry.members) != entry:
                raise JobTableError(f"job {entry.job} is registered already with another token, quota, group or "
                                    f"routes (a clash: choose another job id, or tear the first one down)")
            members = held.members | entry.members
            if len(members) > self.limits.members:
                raise JobTableError(f"job {entry.job}: {len(members)} members, more than the "
                                    f"{self.limits.members} an aggregator holds per job")
            self.entries[entry.job] = replace(held, members=members)
            return self.bases[entry.job]
        limits = self.limits
        if len(self.entries) >= limits.jobs:
            raise JobTableError(f"job {entry.job}: this aggregator holds {limits.jobs} jobs already")
        check_fits(entry, limits)
        base = self._free_range(entry.slots)
        if base is None:
            raise JobTableError(f"job {entry.job}: no {entry.slots} free slots in a row among this aggregator's "
                                f"{self.slots}")
        self.entries[entry.job] = entry
        self.bases[entry.job] = base
        return base

    def remove(self, job: int) -> bool:
        """Tear `job` down (its slots are free for others); whether it was installed."""
        self.bases.pop(job, None)
        return self.entries.pop(job, None) is not None

    def leave(self, job: int, members: Iterable[Endpoint]) -> tuple[int, int]:
        """`members` leave `job` (an island done with it, while others may still run): (how many of them were
        its members, how many members remain). The last member's leave removes the job (`remove`); leaving a
        job that is not installed, or again, changes nothing."""
        entry = self.entries.get(job)
        if entry is None:
            return 0, 0
        staying = entry.members - frozenset(members)
        left = len(entry.members) - len(staying)
        if not staying:
            self.remove(job)
        elif left:
            self.entries[job] = replace(entry, members=staying)
        return left, len(staying)

    def holds(self, slot: int) -> bool:
        """Whether aggregator slot `slot` is in a registered job's range."""
        return any(base <= slot < base + self.entries[job].slots for job, base in self.bases.items())

    def _free_range(self, size: int) -> int | None:
        """The lowest first slot of `size` free slots in a row."""
        taken = sorted((self.bases[job], self.bases[job] + entry.slots) for job, entry in self.entries.items())
        start = 0
        for low, high in taken + [(self.slots, self.slots)]:
            if low - start >= size:
                return start
            start = max(start, high)
        return None

    def __iter__(self) -> Iterator[JobEntry]:
        return iter(self.entries.values())
