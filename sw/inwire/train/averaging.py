"""Model averaging through an inwire aggregator, in rotating cliques (needs the `torch` extra).

`CliqueAverager` goes where PyTorch users put `PeriodicModelAverager` or `HierarchicalModelAverager`
(torch.distributed.algorithms.model_averaging.averagers): the same constructor (`period`, `warmup_steps`,
`process_group`) plus where the island sits in the schedule, and `average_parameters(params)` after every
optimizer step. Every `period` steps after the warmup, the island averages with its clique of the current
schedule round. An island may be a torch.distributed job (a torchrun launch, gloo or NCCL): rank 0 of its
group exchanges with inwire and broadcasts the average inside the group, on the group's device; the group
keeps its own all-reduce for gradients. Optionally the average feeds a DiLoCo-style outer optimizer: any
`torch.optim.Optimizer` built on the anchor parameters (`anchor_parameters`), as torchft's DiLoCo takes one.
It is a `ModelAverager`, so `torch.distributed.optim.PostLocalSGDOptimizer` takes it, and `LocalSGD` gives
torchft's shape: a context manager that averages from the inner optimizer's step hook.

`InwireExchange` carries one island's averagings along the whole schedule through the one member client
(`inwire.client.UdpMember`): each clique at its aggregator city (a city -> address map, as `inwire stream
--target udp:FILE`, or one aggregator for everything), along its reduction tree when it has one. A clique the
schedule exchanges all-to-all (it names no aggregator city) is summed in-network all the same, at the
aggregator of its first member's city when the map has one, else at the map's first aggregator: an island
that reaches an aggregator needs no other path to its peers. Parameters anywhere (CPU or CUDA, any float
dtype) are quantized one at a time straight into the one buffer that the sums and then the average take
over (CPU float32 ones with no copy at all), and the average is written back into them in place: an
averaging takes the model's bytes once more, and the averager keeps them once (its anchor).
"""

from collections.abc import Callable, Iterable, Mapping, Sequence
from numbers import Integral
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np
import numpy.typing as npt
import torch

from ..client import DEFAULT_CHUNK, DEFAULT_WINDOW, ClientError, CliqueKey, UdpMember, clique_group, clique_routes
from ..codec_average import ATTEMPTS, AveragingError, Pieces
from ..datagram import Address, ip_int
from ..jobs import JobEntry
from ..plan.schedule_file import ScheduleFile, member_paths
from ..plan.tables import job_entries
from ..plan.tables import root_city as _root_city
from ..plan.tables import schedule_rounds as _schedule_rounds
from ..protocol import MAX_FANIN
from .layout import LayoutMismatch, check_layouts, layout_words, schedule_text
from .outer import OuterOptimizer

if TYPE_CHECKING:
    from torch.distributed.algorithms.model_averaging.averagers import ModelAverager
else:
    try:
        from torch.distributed.algorithms.model_averaging.averagers import ModelAverager
    except ImportError:  # a torch build without torch.distributed has no averagers to subclass
        ModelAverager = object

__all__ = ["AveragingError", "CliqueAverager", "InwireExchange", "LayoutMismatch", "LocalSGD", "OuterOptimizer",
           "UdpCliqueExchange", "anchor_parameters", "tree_job_entries"]

STATE_KEY = "inwire_averager"
"""Where an optimizer's state_dict() carries the averager's state (`CliqueAverager.keep_state_in`)."""


DEFAULT_DEADLINE_S = 600.0
"""One averaging's deadline by default: torch's default collective timeout (NCCL's 10 minutes), so that an
island that starts slowly (loading data, compiling) does not fail the others' first averaging."""


class InwireExchange:
    """One island's link to inwire for averaging: a `UdpMember` and the codec's shared bound.

    `aggregators`: one aggregator's (host, port), or {city: (host, port)} (all on one port) for per-city
    aggregators and reduction trees. `bound`: every member's first guess of the largest magnitude it sends
    (sums are re-sent at a raised bound when it is too small). `deadline_s` bounds one averaging, from this
    island's first send to its last result: that includes waiting for the slowest member of its clique to
    arrive (at the first averaging, its whole start-up), so its default is torch's own collective timeout
    (10 minutes), not a network round trip. `entry` (or `join(entry)` once `address` is known): the
    registered job (`jobs.JobEntry`) this island is a member of: its averagings are then version 3 frames
    with the job's token and no route, and results count only from the aggregator it sent to, with the token
    (`UdpMember`). With per-city aggregators each member sends to its city's aggregator by the clique's tree
    (docs/schedule.md), whose tables (`tree_job_entries`) hold the route, at any depth. The other keywords go
    to `UdpMember`."""

    def __init__(self, aggregators: Address | Mapping[str, Address], job: int = 1, bound: float = 16.0,
                 chunk: int = DEFAULT_CHUNK, window: int = DEFAULT_WINDOW, timeout_s: float = 0.2,
                 deadline_s: float = DEFAULT_DEADLINE_S, bind: Address | None = None, multicast: bool = False,
                 retries: int | None = None, loss: float = 0.0, seed: int = 0, entry: JobEntry | None = None) -> None:
        if not bound > 0:
            raise ValueError(f"bound must be positive, got {bound}")
        self.bound = bound
        self.client = UdpMember(aggregators, job=job, chunk=chunk, window=window, timeout_s=timeout_s,
                                retries=retries, deadline_s=deadline_s, bind=bind, multicast=multicast, loss=loss,
                                seed=seed)
        self.cities = {city: ip_int(host) for city, (host, _) in self.client.aggregators.items() if city is not None}
        if entry is not None:
            self.join(entry)

    @property
    def address(self) -> Address:
        """Where this island's datagrams come from: what a registered job names as its member."""
        return self.client.address

    def join(self, entry: JobEntry) -> None:
        """Average as a member of registered job `entry` from now on (with per-city aggregators, each registered
        with its tables: `tree_job_entries`)."""
        self.client.join(entry)

    def close(self) -> None:
        self.client.close()

    def average(self, round_index: int, clique_index: int, members: Sequence[str], me: int,
                vector: npt.ArrayLike | Pieces, aggregator: str | None = None, tree: Mapping[str, str] | None = None,
                max_cliques: int = 1, period_round: int = 0,
                nearby: Sequence[tuple[int, int, Sequence[str], str | None]] = ()) -> npt.NDArray[np.float32]:
        """The clique's average of float32 `vector` (or of its `Pieces`), `me` being this island's index in
        `members`; the clique sums at city `aggregator` along `tree` when this exchange has per-city
        aggregators. `nearby`: cliques
        (round index, clique index, members, aggregator) of other rounds holding members of this one; should
        this sum stall, its roll call looks for them there too (those that sum at the same root)."""
        key, city, route, places = self._clique(round_index, clique_index, members, me, aggregator, tree,
                                                max_cliques, period_round, nearby)
        # Every averaging starts from the shared bound: a bound one member raised before would give it
        # another exponent than the rest of this clique.
        average, _ = self.client.average(key, me, vector, self.bound, city, route, members, places)
        return average

    def average_many(self, averagings: Sequence[tuple[int, int, npt.ArrayLike | Pieces]], members: Sequence[str],
                     me: int, aggregator: str | None = None, tree: Mapping[str, str] | None = None,
                     max_cliques: int = 1, period_round: int = 0, words: Sequence[npt.ArrayLike | None] = (),
                     agree: Callable[[int, npt.NDArray[np.int32]], None] | None = None
                     ) -> list[npt.NDArray[np.float32]]:
        """`average` of several (round index, clique index, vector) of one clique `members` at once, their sums
        in flight together (`client.UdpMember.average_many`: `words[i]` and `agree(i, rows)`, averaging i's
        agreement first, as `gather` makes it, and its check): the clique's averages, in order."""
        keys = []
        city, route = None, None
        for round_index, clique_index, vector in averagings:
            key, city, route, _ = self._clique(round_index, clique_index, members, me, aggregator, tree, max_cliques,
                                               period_round, ())
            keys.append((key, vector))
        # Every averaging starts from the shared bound, as `average`'s.
        return [average for average, _ in self.client.average_many(keys, me, self.bound, city, route, members,
                                                                   words=words, agree=agree)]

    def gather(self, round_index: int, clique_index: int, members: Sequence[str], me: int, words: npt.ArrayLike,
               aggregator: str | None = None, tree: Mapping[str, str] | None = None, max_cliques: int = 1,
               period_round: int = 0, nearby: Sequence[tuple[int, int, Sequence[str], str | None]] = ()
               ) -> npt.NDArray[np.int32]:
        """Every member's int32 `words`, row m member m's, gathered where the clique sums (before averaging
        round `round_index`, `client.UdpMember.gather`): what the clique agrees on before its first sum
        (`layout.layout_words`). The other arguments are `average`'s."""
        key, city, route, places = self._clique(round_index, clique_index, members, me, aggregator, tree,
                                                max_cliques, period_round, nearby)
        return self.client.gather(key, me, words, city, route, members, places)

    def _clique(self, round_index: int, clique_index: int, members: Sequence[str], me: int, aggregator: str | None,
                tree: Mapping[str, str] | None, max_cliques: int, period_round: int,
                nearby: Sequence[tuple[int, int, Sequence[str], str | None]]
                ) -> tuple[CliqueKey, str | None, Any, list[tuple[int, int, dict[int, int]]]]:
        """(key, aggregator city, tree fields, nearby places) of this member's sums in a clique."""
        fanin = len(members)
        if not 2 <= fanin <= MAX_FANIN or not 0 <= me < fanin:
            raise ValueError(f"member {me} of a clique of {fanin} is not a valid clique position")
        city, route = self._route(members, me, aggregator, tree)
        group = clique_group(period_round % 256, clique_index % 256)
        key = CliqueKey(self.client.job, round_index, clique_index, group, fanin, 0, max_cliques)
        root = self._root_city(members, aggregator)
        places = [(other_round, other_clique, {members.index(name): there.index(name) for name in there
                                               if name in members})
                  for other_round, other_clique, there, there_aggregator in nearby
                  if self._root_city(there, there_aggregator) == root]
        return key, city, route, places

    def _root_city(self, members: Sequence[str], aggregator: str | None) -> str | None:
        """The city whose aggregator a clique sums at (its roll call's), or None with one aggregator."""
        return _root_city(self.cities, members, aggregator) if self.cities else None

    def _route(self, members: Sequence[str], me: int, aggregator: str | None,
               tree: Mapping[str, str] | None) -> tuple[str | None, Any]:
        """(aggregator city, tree fields) of this member's contributions; (None, None) with one aggregator."""
        if not self.cities:
            return None, None
        root = self._root_city(members, aggregator)
        assert root is not None  # with aggregators by city, a clique always has one
        missing = sorted({root, *(tree or {}).values()} - set(self.cities))
        if missing:
            raise AveragingError(f"no aggregator address for {', '.join(missing)} (the schedule's tree sums there)")
        if self.client.entry is not None:
            # A registered job's frames carry no route: the aggregators' tables hold it, so no depth cap.
            return member_paths(members, root, tree if root == aggregator else None)[members[me]][0], None
        routes = clique_routes(tuple(members), root, tree if root == aggregator else None, self.cities.__getitem__)
        return routes[members[me]]


UdpCliqueExchange = InwireExchange
"""The exchange's earlier name."""


def tree_job_entries(entry: JobEntry, schedule: ScheduleFile | Sequence[Any], islands: Mapping[str, Address],
                     aggregators: Mapping[str, Address]) -> dict[str, JobEntry]:
    """city -> the entry of registered job `entry` its aggregator is registered with, for islands averaging
    along `schedule` (a loaded schedule file, whose trees it follows, or rounds of (members, aggregator)) over
    the per-city `aggregators` ({city: (host, port)}, as `InwireExchange` takes them); `islands` maps each
    island to the address its exchange sends from. Each city's entry holds the islands that send to its
    aggregator in some clique and, per clique index, the route its aggregator holds there (`jobs.tree_routes`;
    a clique flat at its root needs none). The tables hold one route per clique index, so two rounds whose
    cliques of one index would give an aggregator two different routes are refused (`jobs.TreeError`)."""
    return job_entries(entry, schedule, {name: (ip_int(host), port) for name, (host, port) in islands.items()},
                       {city: (ip_int(host), port) for city, (host, port) in aggregators.items()})


def anchor_parameters(model_or_params: torch.nn.Module | Iterable[Any]) -> list[torch.Tensor]:
    """Detached float32 copies of the parameters, on their own devices: what an outer optimizer is built
    on (`torch.optim.SGD(anchor_parameters(model), lr=0.7, momentum=0.9, nesterov=True)`)."""
    params = model_or_params.parameters() if hasattr(model_or_params, "parameters") else model_or_params
    return [p.detach().to(torch.float32).clone() for p in _flat_parameters(params)]


def _flat_parameters(params: Iterable[Any]) -> list[torch.Tensor]:
    """Parameters given as tensors, (name, tensor) pairs or optimizer parameter groups, as a list."""
    return _named_parameters(params)[0]


def _named_parameters(params: Iterable[Any]) -> tuple[list[torch.Tensor], list[str] | None]:
    """(parameters as a list, their names or None) of tensors, of (name, tensor) pairs (`named_parameters()`)
    or of optimizer parameter groups (dicts with "params", and "param_names" where torch keeps them)."""
    params = list(params)
    if params and isinstance(params[0], dict):
        names = [name for group in params for name in group.get("param_names", ())]
        params = [p for group in params for p in group["params"]]
        return params, (names if len(names) == len(params) else None)
    if params and isinstance(params[0], tuple):
        return [p for _, p in params], [name for name, _ in params]
    return params, None


def _storages(tensors: Iterable[torch.Tensor]) -> set[int]:
    """Where the tensors' values live (their storages' addresses), empty tensors left out."""
    return {t.untyped_storage().data_ptr() for t in tensors if t.numel()}


class CliqueAverager(ModelAverager):
    """Every `period` steps after `warmup_steps`, average parameters with this island's current clique.

    Same call shape as PyTorch's `PeriodicModelAverager(period, warmup_steps, process_group)`, plus keywords:
    `island` (its name in the schedule), `schedule` (a loaded schedule file, `load_schedule_file`, which
    brings each clique's aggregator city and tree; or a plain list of rounds of (members, aggregator)),
    `exchange` (an `InwireExchange`; needed on the group's rank 0 only) and the outer step, one of
    `outer_optimizer` (a `torch.optim.Optimizer` built on `anchor_parameters(model)`) or `outer` (the
    numpy `OuterOptimizer` the study uses); neither: plain averaging. `rounds` is the earlier name of
    `schedule`. One difference: PyTorch averages at the first call after the warmup; this averager after
    `period` steps, so a sync never comes before any local step.
    Before a clique's first averaging its members agree on what they average (`layout`: the parameters'
    shapes, order, dtypes, names when given `named_parameters()`, and the schedule), in one small sum: islands
    that differ raise `LayoutMismatch` on every island, nothing averaged.
    `process_group`: the island's own group; None means the default group if torch.distributed is
    initialized, else a single-process island. Its rank 0 exchanges and broadcasts the average.
    `state_dict()` / `load_state_dict()` carry the step count, the rotation's position, the anchor and the
    outer state, so a resumed job continues the same rotation bit for bit. Under torch's
    `PostLocalSGDOptimizer`, whose checkpoint holds only the averager's `step`, call `keep_state_in(optimizer)`
    on the inner optimizer so that its checkpoints carry all of it (`step`).
    """

    keep_vectors = False
    """Whether `last` holds the vectors sent and received (for logs and checks): a copy of the model's bytes,
    and with an outer step a second one, kept until the next averaging; set it on the instance (or class)."""

    # Wider than ModelAverager's: torch's averagers need an initialized group, this one runs without.
    process_group: "torch.distributed.ProcessGroup | None"  # type: ignore[assignment]
    """The island's group; None on a single-process island."""

    # A string: torch builds without torch.distributed have no ProcessGroup to name at import.
    def __init__(self, period: int, warmup_steps: int = 0,
                 process_group: "torch.distributed.ProcessGroup | None" = None, *, island: str,
                 schedule: ScheduleFile | Sequence | None = None, rounds: ScheduleFile | Sequence | None = None,
                 exchange: InwireExchange | None = None, outer: OuterOptimizer | None = None,
                 outer_optimizer: torch.optim.Optimizer | None = None) -> None:
        given = rounds if schedule is None else schedule
        if given is None or (schedule is not None and rounds is not None):
            raise ValueError("give the schedule (schedule=, or its earlier name rounds=) once")
        self.rounds, self.trees = _schedule_rounds(given)
        named = {member for cliques in self.rounds for members, _ in cliques for member in members}
        if island not in named:
            raise ValueError(f"the schedule does not name island {island!r}; it names {', '.join(sorted(named))}")
        if period < 1 or warmup_steps < 0:
            raise ValueError(f"period must be at least 1 and warmup_steps not negative, got {period}, {warmup_steps}")
        if outer is not None and outer_optimizer is not None:
            raise ValueError("give one outer step: outer (numpy) or outer_optimizer (torch)")
        self.island, self.exchange = island, exchange
        self.period, self.warmup_steps = period, warmup_steps
        self.outer = outer or OuterOptimizer()
        self.outer_optimizer = outer_optimizer
        self.outer_checked = False
        """The outer optimizer was found not to hold the model's parameters (`_refuse_an_outer_optimizer_on`)."""
        self.max_cliques = max(len(cliques) for cliques in self.rounds)
        self.schedule_text = schedule_text(self.rounds, self.trees)
        self.agreed: dict[tuple[int, int], bytes] = {}
        """(schedule round, clique) -> the layout words its members agreed on (`layout`): a clique agrees again
        only when this island's words change."""
        self.group = process_group
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        # ModelAverager's own __init__ needs an initialized default group; a single-process island has none
        # (torch's WORLD is None until the default group is initialized).
        group = process_group or (torch.distributed.group.WORLD if distributed else None)
        self.process_group = group
        self.distributed = distributed
        self.rank = torch.distributed.get_rank(process_group) if distributed else 0
        self.source = torch.distributed.get_global_rank(group, 0) if distributed and group is not None else 0
        if self.rank == 0 and exchange is None:
            raise ValueError("the island's rank 0 needs an exchange to reach inwire")
        self._step = 0
        self.rounds_done = 0
        self.resumed = False
        """Loaded from a checkpoint and not averaged since (`_nearby`)."""
        self.anchor: np.ndarray | None = None
        self.buffer: np.ndarray | None = None
        self.last: tuple[int, list[str], np.ndarray | None, np.ndarray | None] | None = None
        """(round index, members, vector sent, average received) of the latest averaging, for logs and checks;
        the vectors None unless `keep_vectors`."""

    @property
    def step(self) -> int:
        """Optimizer steps counted so far (`ModelAverager.step`)."""
        return self._step

    @step.setter
    def step(self, value: int) -> None:
        """A step set from outside: what `PostLocalSGDOptimizer.load_state_dict` restores. Plain averaging
        needs nothing else (its rotation's position follows from the step); an outer step also needs its
        anchor and momentum, which only `keep_state_in` or `state_dict()` bring, so it is refused."""
        value = _whole_number("step", value)
        if value == self._step:
            return
        if self.outer_optimizer is not None or not self.outer.plain:
            raise ValueError(f"checkpoint field 'step': {value} alone would resume the rotation without the outer "
                             f"step's anchor and momentum (PostLocalSGDOptimizer saves only the averager's step); "
                             f"call averager.keep_state_in(inner_optimizer) before saving, or save "
                             f"averager.state_dict() beside the optimizer's")
        rounds_done = max(0, value - self.warmup_steps) // self.period
        if rounds_done > MAX_ROUNDS:
            raise ValueError(f"checkpoint field 'step': {value} steps are {rounds_done} averagings, past the last "
                             f"round the protocol numbers ({MAX_ROUNDS})")
        self._step, self.rounds_done, self.resumed = value, rounds_done, True

    def keep_state_in(self, optimizer: torch.optim.Optimizer) -> list:
        """From now on `optimizer.state_dict()` carries this averager's `state_dict()` (under "inwire_averager")
        and `optimizer.load_state_dict()` restores it, checked first as `load_state_dict` checks it. Give the
        optimizer `PostLocalSGDOptimizer` wraps (or the wrapper itself): its checkpoints then resume the whole
        rotation, anchor and outer momentum included. Returns the hooks' handles (`handle.remove()`)."""
        inner = getattr(optimizer, "optim", None)
        if isinstance(inner, torch.optim.Optimizer):
            optimizer = inner  # PostLocalSGDOptimizer: its state_dict() is the inner one's plus "step"

        def save(_optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
            state[STATE_KEY] = self.state_dict()

        def load(_optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> dict[str, Any]:
            if STATE_KEY in state:
                self.load_state_dict(state.pop(STATE_KEY))
            return state

        return [optimizer.register_state_dict_post_hook(save), optimizer.register_load_state_dict_pre_hook(load)]

    def set_anchor(self, params: Iterable) -> None:
        """Start the outer step from these parameters (else from those at the first call)."""
        with torch.no_grad():
            self.anchor = _flatten(_flat_parameters(params))

    def average_parameters(self, params: Iterable) -> list[str] | None:
        """Call after each optimizer step; returns the clique it averaged with, or None. `params`: the model's
        parameters, its `named_parameters()` (errors then name a parameter by name) or an optimizer's
        parameter groups."""
        params, names = _named_parameters(params)
        if self.outer_optimizer is not None and not self.outer_checked:
            self._refuse_an_outer_optimizer_on(self.outer_optimizer, params)
            self.outer_checked = True
        if self.anchor is None:
            self.set_anchor(params)
        else:
            # A loaded anchor meets the model here first: one of another model's size is refused before any step.
            _check_length(self.anchor, sum(p.numel() for p in params), "the model has")
        self._step += 1
        if self._step <= self.warmup_steps or (self._step - self.warmup_steps) % self.period:
            return None
        round_index = self.rounds_done
        self.rounds_done += 1
        period_round = round_index % len(self.rounds)
        for clique_index, (members, aggregator) in enumerate(self.rounds[period_round]):
            if self.island in members and len(members) > 1:
                clique = list(members)
                tree = self.trees[period_round][clique_index] if self.trees else None
                words = layout_words(params, names, self.schedule_text)
                agreed = self.agreed.get((period_round, clique_index)) == words.tobytes()
                with torch.no_grad():
                    self.last = None  # its vectors are not to share this averaging's peak
                    if not _finite(params):
                        raise AveragingError(_non_finite(params, names, self._step, round_index))
                    sent = _flatten(params) if self.keep_vectors else None
                    average = self._average(round_index, clique_index, clique, _pieces(params), aggregator, tree,
                                            period_round, params[0].device, self._nearby(round_index, clique),
                                            None if agreed else words)
                    self.agreed[period_round, clique_index] = words.tobytes()
                    self.last = (round_index, clique, sent, average if self.keep_vectors else None)
                    self.anchor = self._outer_step(average)
                    _load(params, self.anchor)
                return clique
        return None

    def _refuse_an_outer_optimizer_on(self, outer_optimizer: torch.optim.Optimizer,
                                      params: Iterable[torch.Tensor]) -> None:
        """An outer optimizer built on the model's own parameters (torchft's DiLoCo takes it so, keeping its
        own backup of the anchor) would step the local parameters instead of the anchor: every island would
        train on without ever agreeing. Refused before any step."""
        anchors = [p for group in outer_optimizer.param_groups for p in group["params"]]
        if _storages(anchors) & _storages(params):
            raise ValueError("outer_optimizer holds the model's own parameters; build it on "
                             "anchor_parameters(model), the copies the outer step moves (torch.optim.SGD("
                             "anchor_parameters(model), lr=0.7, momentum=0.9, nesterov=True))")

    def _outer_step(self, average: np.ndarray) -> np.ndarray:
        assert self.anchor is not None  # `average_parameters` set it before its first averaging
        if self.outer_optimizer is None and self.outer.plain:
            return average  # this averaging's own buffer, which nothing else holds: the anchor without a copy
        if self.outer_optimizer is None:
            # The anchor and the buffer are the averager's own (checkpoints take and give copies).
            self.buffer = self.outer.step_in_place(self.anchor, self.buffer, average)
            return self.anchor
        # The outer gradient is anchor - average, on the optimizer's own parameters (the anchor).
        anchors = [p for group in self.outer_optimizer.param_groups for p in group["params"]]
        offset = 0
        for p in anchors:
            piece = torch.from_numpy(average[offset:offset + p.numel()]).view_as(p).to(p.device, p.dtype)
            p.grad = p.detach() - piece
            offset += p.numel()
        if offset != len(average):
            raise ValueError(f"the outer optimizer holds {offset} parameters, the model {len(average)}; build it "
                             f"on anchor_parameters(model)")
        self.outer_optimizer.step()
        self.outer_optimizer.zero_grad(set_to_none=True)
        _store(anchors, self.anchor)
        return self.anchor

    def _nearby(self, round_index: int, members: Iterable[str]) -> list[tuple[int, int, list[str], str | None]]:
        """The cliques of the next round, and of the previous one just after a resume, that hold peers of this
        one: where a stalled averaging looks for peers resumed from a checkpoint of another round. The previous
        round only then: a running island's peers have left their records of it behind."""
        resumed, self.resumed = self.resumed, False
        peers = set(members) - {self.island}
        rounds = [round_index + 1] + ([round_index - 1] if resumed and round_index > 0 else [])
        return [(other, clique_index, list(there), aggregator) for other in rounds
                for clique_index, (there, aggregator) in enumerate(self.rounds[other % len(self.rounds)])
                if len(there) > 1 and peers & set(there)]

    def _average(self, round_index: int, clique_index: int, members: Sequence[str], pieces: Pieces,
                 aggregator: str | None, tree: Mapping[str, str] | None, period_round: int, device: torch.device,
                 nearby: Sequence[tuple[int, int, Sequence[str], str | None]],
                 words: np.ndarray | None) -> np.ndarray:
        """Rank 0 asks inwire; with a process group it broadcasts the average (or its failure) to the others,
        in tensors on the group's device (NCCL takes only CUDA tensors). `words`: this island's layout words
        (`layout.layout_words`), which the clique first agrees on, when it has not yet."""
        error: Exception | None = None
        average: np.ndarray | None = None
        if self.rank == 0:
            assert self.exchange is not None  # `__init__` refuses a rank 0 without one
            try:
                if words is not None:
                    rows = self.exchange.gather(round_index, clique_index, members, members.index(self.island), words,
                                                aggregator=aggregator, tree=tree, max_cliques=self.max_cliques,
                                                period_round=period_round, nearby=nearby)
                    check_layouts(rows, members, f"round {round_index}, clique {clique_index} "
                                                 f"({', '.join(members)})")
                average = self.exchange.average(round_index, clique_index, members, members.index(self.island),
                                                pieces, aggregator=aggregator, tree=tree, max_cliques=self.max_cliques,
                                                period_round=period_round, nearby=nearby)
            except (AveragingError, ClientError, OSError, ValueError) as failure:
                error = failure
        if not self.distributed:
            if error is not None:
                raise error
            assert average is not None  # a single-process island is its own rank 0
            return average
        if torch.distributed.get_backend(self.group) != "nccl":
            device = torch.device("cpu")
        # A status first, so that the other ranks raise instead of waiting for a vector that never comes, then
        # rank 0's reason, so that every rank's error says it (the islands whose contributions never arrived).
        status = torch.tensor([0 if error is None else 1], dtype=torch.int32, device=device)
        torch.distributed.broadcast(status, src=self.source, group=self.group)
        if int(status.item()) != 0:
            reason = [None if error is None else (str(error), getattr(error, "missing", ()))]
            torch.distributed.broadcast_object_list(reason, src=self.source, group=self.group, device=device)
            if error is not None:
                raise error
            # Filled in on this rank by the broadcast.
            message, missing = cast(tuple[str, Sequence[str]], reason[0])
            raise AveragingError(f"round {round_index}: rank 0 of island {self.island} could not average with its "
                                 f"clique: {message}", missing)
        carrier = (torch.from_numpy(np.ascontiguousarray(average)) if average is not None
                   else torch.empty(pieces.count, dtype=torch.float32)).to(device)
        torch.distributed.broadcast(carrier, src=self.source, group=self.group)
        return carrier.cpu().numpy()

    def state_dict(self) -> dict[str, Any]:
        """What a resumed job needs to continue the same rotation bit for bit."""
        state: dict[str, Any] = {
            "step": self._step, "rounds_done": self.rounds_done,
            "anchor": None if self.anchor is None else torch.from_numpy(self.anchor.copy()),
            "buffer": None if self.buffer is None else torch.from_numpy(np.array(self.buffer))}
        if self.outer_optimizer is not None:
            state["outer_optimizer"] = self.outer_optimizer.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from `state_dict()`'s state; every field is checked before any is taken (ValueError naming
        the field), so a tampered or mismatched checkpoint changes nothing."""
        if not isinstance(state, Mapping):
            raise ValueError(f"checkpoint: a {type(state).__name__}, not the mapping state_dict() returns")
        fields = {"step", "rounds_done", "anchor", "buffer"}
        if self.outer_optimizer is not None:
            fields.add("outer_optimizer")
        for name in sorted(fields - set(state)):
            raise ValueError(f"checkpoint field {name!r}: missing")
        for name in sorted(set(state) - fields):
            extra = " (saved with an outer_optimizer this averager does not have)" if name == "outer_optimizer" else ""
            raise ValueError(f"checkpoint field {name!r}: not a field of this averager's state{extra}")
        step = _whole_number("step", state["step"])
        rounds_done = _whole_number("rounds_done", state["rounds_done"])
        if rounds_done > step:
            raise ValueError(f"checkpoint field 'rounds_done': {rounds_done} averagings in {step} steps (at most one "
                             f"a step)")
        if rounds_done > MAX_ROUNDS:
            raise ValueError(f"checkpoint field 'rounds_done': {rounds_done} is past the last round the protocol "
                             f"numbers ({MAX_ROUNDS})")
        anchor = _vector("anchor", state["anchor"])
        buffer = _vector("buffer", state["buffer"])
        if anchor is None and step > 0:
            raise ValueError(f"checkpoint field 'anchor': None after {step} steps (the anchor is set at the first)")
        if buffer is not None and len(buffer) != (0 if anchor is None else len(anchor)):
            raise ValueError(f"checkpoint field 'buffer': {len(buffer)} values, the anchor "
                             f"{0 if anchor is None else len(anchor)}")
        if self.outer_optimizer is not None:
            anchors = [p for group in self.outer_optimizer.param_groups for p in group["params"]]
            if anchor is not None:
                _check_length(anchor, sum(p.numel() for p in anchors), "the outer optimizer holds")
            try:
                self.outer_optimizer.load_state_dict(state["outer_optimizer"])
            except (AttributeError, KeyError, TypeError, ValueError) as error:
                raise ValueError(f"checkpoint field 'outer_optimizer': {error}") from None
            if anchor is not None:
                # An optimizer's state holds its momentum, not its parameters: the anchor is put back here.
                with torch.no_grad():
                    _load(anchors, anchor)
        self._step, self.rounds_done, self.anchor, self.buffer = step, rounds_done, anchor, buffer
        self.resumed = True


class LocalSGD:
    """torchft's shape: `with LocalSGD(model, optimizer, sync_every, averager=averager):` around the training
    loop, which then calls only `optimizer.step()`. A post-step hook on the inner optimizer calls
    `averager.average_parameters(model.named_parameters())` after every step, so the averagings fall at the
    same steps, to the same bits, as the explicit calls; `sync_every` must be the averager's `period` (the
    averager counts the steps). DiLoCo is this with an averager built with `outer_optimizer`. Inside the
    block the optimizer's checkpoints carry the averager's state (`CliqueAverager.keep_state_in`); leaving
    it removes every hook."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, sync_every: int, *,
                 averager: CliqueAverager) -> None:
        if sync_every != averager.period:
            raise ValueError(f"sync_every {sync_every} is not the averager's period {averager.period}; the averager "
                             f"counts the steps, so give it the period")
        self.model, self.optimizer, self.averager = model, optimizer, averager
        self.handles: list[torch.utils.hooks.RemovableHandle] = []

    def __enter__(self) -> "LocalSGD":
        if self.handles:
            raise RuntimeError("this LocalSGD is already entered; its hooks would average twice a step")
        self.handles = [self.optimizer.register_step_post_hook(self._after_step),
                        *self.averager.keep_state_in(self.optimizer)]
        return self

    def __exit__(self, *exception: object) -> Literal[False]:
        for handle in self.handles:
            handle.remove()
        self.handles = []
        return False

    def _after_step(self, _optimizer: torch.optim.Optimizer, _args: object, _kwargs: object) -> None:
        self.averager.average_parameters(self.model.named_parameters())


MAX_ROUNDS = 2**32 // ATTEMPTS - 1
"""The last averaging round whose attempts all have a protocol round number (32 bits, ATTEMPTS per round)."""


def _whole_number(name: str, value: object) -> int:
    """A checkpoint's count: a non-negative integer (a bool or a float is a tampered one)."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ValueError(f"checkpoint field {name!r}: {value!r} is not a whole number")
    if value < 0:
        raise ValueError(f"checkpoint field {name!r}: {value} is negative")
    return int(value)


def _vector(name: str, value: object) -> np.ndarray | None:
    """A checkpoint's vector (a float32 tensor of one dimension, every value finite) as numpy, or None."""
    if value is None:
        return None
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"checkpoint field {name!r}: a {type(value).__name__}, not a tensor")
    if value.dtype != torch.float32:
        raise ValueError(f"checkpoint field {name!r}: {str(value.dtype).removeprefix('torch.')}, not float32")
    if value.dim() != 1:
        raise ValueError(f"checkpoint field {name!r}: shape {tuple(value.shape)}, not one vector")
    vector = value.detach().cpu().numpy().copy()
    for count, kind in ((np.isnan(vector).sum(), "NaN"), (np.isinf(vector).sum(), "infinite")):
        if count:
            raise ValueError(f"checkpoint field {name!r}: {count} {kind} values")
    return vector


def _non_finite(params: Sequence[torch.Tensor], names: Sequence[str] | None, step: int, round_index: int) -> str:
    """The message for parameters holding NaN or infinite values (as the float32 they are staged in): the
    first such parameter, by name where the averager was given names, else by index and shape."""
    index, values = next((index, values) for index, values in enumerate(p.detach().to(torch.float32) for p in params)
                         if not torch.isfinite(values).all())
    which = repr(names[index]) if names else f"{index} of {len(params)}"
    counts = [(int(torch.isnan(values).sum()), "NaN"), (int(torch.isinf(values).sum()), "infinite")]
    held = " and ".join(f"{count} {kind}" for count, kind in counts if count)
    return (f"step {step}: parameter {which} (shape {tuple(values.shape)}) holds {held} values at averaging round "
            f"{round_index}; the island's training diverged since its last averaging (a lower learning rate or "
            f"gradient clipping may help)")


def _check_length(anchor: np.ndarray, expected: int, holder: str) -> None:
    if len(anchor) != expected:
        raise ValueError(f"checkpoint field 'anchor': {len(anchor)} values, {holder} {expected} parameters")


def _flatten(params: Sequence[torch.Tensor]) -> np.ndarray:
    """The parameters as one new float32 numpy vector (copied, whatever their device and dtype)."""
    flat = np.empty(sum(p.numel() for p in params), dtype=np.float32)
    _store(params, flat)
    return flat


def _store(params: Iterable[torch.Tensor], flat: np.ndarray) -> None:
    """Copy the parameters into float32 vector `flat`, one after another."""
    into = torch.from_numpy(flat)
    offset = 0
    for p in params:
        into[offset:offset + p.numel()].copy_(p.detach().reshape(-1))
        offset += p.numel()


def _pieces(params: Sequence[torch.Tensor]) -> Pieces:
    """The parameters as the float32 pieces of one vector, each made when the codec quantizes it: a CPU
    float32 parameter is its own memory, any other is converted alone (one parameter's copy at a time)."""
    def make() -> Iterable[np.ndarray]:
        for p in params:
            values = p.detach().reshape(-1)
            yield values.to("cpu", torch.float32).numpy()

    return Pieces(sum(p.numel() for p in params), make)


def _finite(params: Iterable[torch.Tensor]) -> bool:
    """Whether every parameter holds only values finite as float32, without a copy of any: a parameter's
    extremes are finite exactly when all its values are (a NaN makes them NaN)."""
    for p in params:
        if p.numel():
            extremes = torch.stack(torch.aminmax(p.detach())).to(torch.float32)
            if not bool(torch.isfinite(extremes).all()):
                return False
    return True


def _load(params: Iterable[torch.Tensor], vector: np.ndarray) -> None:
    """Copy a flat vector into the parameters in place, so optimizers and DDP keep their references."""
    offset = 0
    for p in params:
        p.copy_(torch.from_numpy(vector[offset:offset + p.numel()]).view_as(p).to(p.device, p.dtype))
        offset += p.numel()
