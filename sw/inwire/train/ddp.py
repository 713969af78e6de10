"""A DistributedDataParallel communication hook that sums gradients across islands through inwire.

Synchronous data parallelism across islands, SwitchML's use case, in the shape DDP users know:

    state = InwireHookState(exchange, island="LON", islands=["LON", "NYC", "SIN"])   # exchange: rank 0 only
    ddp_model.register_comm_hook(state, inwire_hook)

Each gradient bucket is first averaged inside the island on the island's own backend (gloo or NCCL, the process
group DDP runs on), then its rank 0 averages the island means across islands through the aggregator, as one clique
of every island (the global clique, or the tree the schedule gives it through `aggregator` and `tree`), with the
codec's shared exponent and its overflow re-send; the result is broadcast back inside the island and the future
returns it. Every island gets the same bits: the codec's average of the island means
(`codec_average.clique_average`). The hook does not wait for the sum: it starts the island's all-reduce and returns
a future, and a worker thread of the state sums the buckets as DDP hands them over, so the backward pass goes on
computing while earlier buckets travel: each time, every bucket handed over since its last sums began, their sums
in flight together on the exchange's socket (`InwireExchange.average_many`; each bucket has its own slots, its
index being the sum's clique), then each broadcast in the island in turn. The worker exists only while buckets are
pending: it ends when the queue is empty, so no thread outlives the step or an error. A failure in the worker
completes the bucket's future with the exception (DDP raises it from backward) and the step's later buckets with an
error that names it, on every rank of the island. A bucket's sum is named by the step and the bucket's index (round
and clique fields), so islands whose buckets become ready in another order still meet in the same slots. Every
island must build the same buckets (the same model and `bucket_cap_mb`), as every rank of one DDP job does; DDP
checks that between the ranks of one island only, so the islands agree on each bucket's layout (its parameters'
shapes and dtypes, in order, `layout.layout_words`) before its first sum, and again when DDP rebuilds its buckets
after the first step: an island whose buckets differ (its submodules registered in another order) fails backward on
every island with `layout.LayoutMismatch` instead of adding other parameters' gradients position by position.
Buckets anywhere (CPU or CUDA) are staged through a reusable float32 host buffer each (pinned where CUDA is
present), as `CliqueAverager` stages parameters.

A bucket holding NaN or infinity on some island (mixed precision's overflow, which `torch.amp.GradScaler`
expects to see after the all-reduce) leaves every island NaN, as DDP's all-reduce leaves every rank
non-finite: the scaler of every rank of every island then skips the step and lowers its scale alike. The
integer codec carries no NaN, so each island's mean goes out with one flag element per island (0, or the
shared bound at the island's own position when its mean is not finite, its values then sent as zeros): every
island reads the same flags in the same average, so every island decides alike. A finite bucket's flags are
0, which neither moves the exponent (it comes from the bound) nor the other elements' sums: its average is
the one the bucket alone gives.
"""

import contextlib
import math
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.distributed as dist

from ..client import DEFAULT_WINDOW, SLOT_POOLS, ClientError
from ..codec_average import AveragingError
from ..protocol import DEFAULT_SLOTS
from .layout import check_layouts, layout_words, schedule_text

if TYPE_CHECKING:
    from ..plan.schedule_file import ScheduleFile, Tree
    from .averaging import InwireExchange


def default_buckets(islands: int) -> int:
    """The most buckets whose sums (4 x buckets x the default window slots, `client.slots_needed`) and roll-call
    records (one per island per bucket, `client.presence_slot`) fit the service's default slots: so that a
    missing island can be named."""
    return DEFAULT_SLOTS // (SLOT_POOLS * DEFAULT_WINDOW + islands)


@dataclass
class _Job:
    """One bucket handed to the worker: its sum's names, its gradients (the DDP bucket's buffer), the island's
    all-reduce of them (None for a one-rank island), the future the hook returned, the CUDA stream the
    gradients were computed on (None on CPU), and the bucket's layout words when the islands have not agreed
    on them yet (`layout.layout_words`)."""
    step: int
    index: int
    tensor: torch.Tensor
    reduced: "torch.futures.Future[list[torch.Tensor]] | None"
    future: "torch.futures.Future[torch.Tensor]"
    stream: "torch.cuda.Stream | None"
    words: np.ndarray | None = None
    last: "tuple[int, int, np.ndarray, np.ndarray] | None" = None
    """On rank 0, once summed: what `InwireHookState.last` holds while its future completes."""


class InwireHookState:
    """What `inwire_hook` needs: rank 0's `exchange` (an `InwireExchange`; None on the other ranks), this
    island's name and every island's (the global clique, in one order on every island), the island's
    process group (None: the default group), and the clique's aggregator city and tree when the exchange
    has per-city aggregators. `buckets` bounds the buckets of the model (the slot layout's stride: 4 x
    buckets x the exchange's window slots at the aggregator; DDP's default 25 MB buckets give one per 25 MB
    of gradients); None: `default_buckets` (13 for 3 islands, 10 for 9)."""

    def __init__(self, exchange: "InwireExchange | None", island: str, islands: Iterable[str],
                 process_group: dist.ProcessGroup | None = None, aggregator: str | None = None,
                 tree: "Tree | None" = None, buckets: int | None = None) -> None:
        names = list(islands)
        if island not in names:
            raise ValueError(f"island {island!r} is not one of {', '.join(names)}")
        if buckets is None:
            buckets = default_buckets(len(names))
        self.exchange, self.island, self.islands = exchange, island, names
        self.group = process_group
        self.aggregator, self.tree = aggregator, tree
        self.schedule = schedule_text([[(names, aggregator)]], [[tree]])
        self.agreed: dict[int, bytes] = {}
        """Bucket index -> the layout words the islands agreed on for it (written by the worker)."""
        self.step = 0
        self.buckets = buckets
        if dist.get_rank(process_group) == 0 and exchange is None:
            raise ValueError("the island's rank 0 needs an exchange to reach inwire")
        self.hosts: dict[int, torch.Tensor] = {}
        """Bucket index -> the reusable host buffer the bucket is staged through (pinned where CUDA is present):
        one per bucket, since the buckets handed over together are in flight together; the model's size in all."""
        self.last: tuple[int, int, np.ndarray, np.ndarray] | None = None
        """On rank 0: (step, bucket index, island mean sent, average received) of the bucket whose future
        completed last (set just before it completes: a callback on the future reads its own), for logs and
        checks; the island mean is a view of the bucket's host buffer, valid until its next sum."""
        self.non_finite: tuple[int, int, list[str]] | None = None
        """On rank 0: (step, bucket index, the islands whose mean held NaN or infinity) of the latest bucket
        that every island ended as NaN; None until one did."""
        self._jobs: deque[_Job] = deque()
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self.failure: tuple[int, int, Exception] | None = None
        """(step, bucket index, error) of the first bucket the worker could not sum in the latest step that had
        one, the error as raised (DDP's backward raises it wrapped in a RuntimeError); the step's later buckets
        fail naming it, as a backward stops at its first error."""
        self._results: dist.ProcessGroup | None = None
        """The island's ranks again, for rank 0's status and sum: a group of their own, because the worker
        broadcasts on it while the backward pass issues the next buckets' all-reduces (and DDP its own
        collectives) on `process_group`; one group's collectives must come in one order on every rank."""
        if dist.get_world_size(process_group) > 1:
            self._results = dist.new_group(dist.get_process_group_ranks(process_group or dist.group.WORLD),
                                           backend=dist.get_backend(process_group),
                                           use_local_synchronization=True)

    def submit(self, job: _Job) -> None:
        """Queues a bucket for the worker, starting one when none runs."""
        with self._lock:
            self._jobs.append(job)
            if self._worker is None:
                # Not a daemon: it completes the step's last future from inside torch, and a daemon thread still
                # there when the interpreter exits is stopped inside C++ ("terminate called without an active
                # exception"); exit waits for it instead, at most the rest of the exchange's deadline.
                self._worker = threading.Thread(target=self._drain, name=f"inwire-hook-{self.island}")
                self._worker.start()

    def _drain(self) -> None:
        """The worker: sums what is queued, all of it at once (the buckets DDP handed over while the previous ones
        were summed, in flight together), until nothing is left, then ends."""
        while True:
            with self._lock:
                if not self._jobs:
                    self._worker = None
                    return
                jobs = list(self._jobs)
                self._jobs.clear()
            try:
                errors = self._sum(jobs)
            except Exception as failure:  # any: the futures carry it to backward instead of a hang
                errors = [failure] * len(jobs)
            for job, error in zip(jobs, errors, strict=True):
                if error is None:
                    # The bucket's own, for a callback on its future (the log reads it there).
                    if job.last is not None:
                        self.last = job.last
                    job.future.set_result(job.tensor)
                    continue
                if self.failure is None or self.failure[0] != job.step:
                    self.failure = (job.step, job.index, error)
                job.future.set_exception(error)  # type: ignore[arg-type]  # torch types it as the result

    def _sum(self, jobs: list[_Job]) -> list[Exception | None]:
        """Buckets handed over together: each one's island mean, rank 0's averages of them across islands (their
        sums in flight together), each broadcast in the island in turn (the order every rank's worker keeps,
        however it groups the buckets); each bucket's error, or None."""
        for job in jobs:
            if job.reduced is not None:
                with _on(job.stream):
                    job.reduced.wait()
                    job.tensor.div_(dist.get_world_size(self.group))
        errors: list[Exception | None] = [None] * len(jobs)
        if dist.get_rank(self.group) == 0:
            errors = self._across_islands(jobs)
        for index, job in enumerate(jobs):
            with _on(job.stream):
                if self._results is not None:
                    tensor = job.tensor
                    device = tensor.device if dist.get_backend(self._results) == "nccl" else torch.device("cpu")
                    status = torch.tensor([0 if errors[index] is None else 1], dtype=torch.int32, device=device)
                    dist.broadcast(status, src=_first_rank(self.group), group=self._results)
                    if int(status.item()) != 0 and errors[index] is None:
                        errors[index] = AveragingError(f"step {job.step}, bucket {job.index}: rank 0 of island "
                                                       f"{self.island} could not sum it across islands")
                    if errors[index] is None:
                        dist.broadcast(tensor, src=_first_rank(self.group), group=self._results)
                if errors[index] is None and job.stream is not None:
                    job.stream.synchronize()
        return errors

    def _across_islands(self, jobs: list[_Job]) -> list[Exception | None]:
        """Rank 0: each bucket's island mean averaged across islands into the bucket (NaN if any island's was
        not finite), their sums in flight together; each bucket's error, or None. A failure fails the first
        bucket with its error and the others naming it."""
        step = jobs[0].step
        if self.failure is not None and self.failure[0] == step:
            _, index, first = self.failure
            return [self._after(job, index, first) for job in jobs]
        staged = [(self.stage(job.index, job.tensor), job.tensor.numel()) for job in jobs]
        for host, size in staged:
            self.flag(host, size)
        assert self.exchange is not None, "rank 0 has the exchange (InwireHookState checks)"
        me = self.islands.index(self.island)
        def agree(index: int, rows: np.ndarray) -> None:
            job = jobs[index]
            check_layouts(rows, self.islands, f"step {job.step}, bucket {job.index} ({', '.join(self.islands)})")
            assert job.words is not None  # only a bucket with words has an agreement
            self.agreed[job.index] = job.words.tobytes()

        try:
            averages = self.exchange.average_many([(job.step, job.index, host) for job, (host, _) in zip(jobs, staged)],
                                                  self.islands, me, aggregator=self.aggregator, tree=self.tree,
                                                  max_cliques=self.buckets, words=[job.words for job in jobs],
                                                  agree=agree)
        except (AveragingError, ClientError, OSError, ValueError) as failure:
            return [failure, *(self._after(job, jobs[0].index, failure) for job in jobs[1:])]
        for job, (host, size), average in zip(jobs, staged, averages, strict=True):
            job.last = (job.step, job.index, host[:size], average[:size])
            flagged = [island for island, flag in zip(self.islands, average[size:]) if flag != 0]
            if flagged:
                self.non_finite = (job.step, job.index, flagged)
                job.tensor.fill_(math.nan)
            else:
                job.tensor.copy_(torch.from_numpy(np.ascontiguousarray(average[:size])).view_as(job.tensor))
        return [None] * len(jobs)

    @staticmethod
    def _after(job: _Job, index: int, first: Exception) -> AveragingError:
        return AveragingError(f"step {job.step}, bucket {job.index}: not summed, bucket {index} of this step failed "
                              f"first: {first}")

    def stage(self, index: int, tensor: torch.Tensor) -> np.ndarray:
        """What this island sends for bucket `index`, as a float32 numpy vector in the bucket's host buffer: the
        bucket, whatever its device and dtype, then one flag element per island (`flag`)."""
        size = tensor.numel() + len(self.islands)
        host = self.hosts.get(index)
        if host is None or host.numel() < size:
            host = self.hosts[index] = torch.empty(size, dtype=torch.float32, pin_memory=torch.cuda.is_available())
        staged = host[:size]
        staged[:tensor.numel()].copy_(tensor.detach().reshape(-1))
        staged[tensor.numel():].zero_()
        return staged.numpy()

    def flag(self, staged: np.ndarray, size: int) -> None:
        """Marks a staged bucket of `size` values that holds NaN or infinity: its values become zeros (the codec
        takes only finite values, and every island discards this average) and this island's flag the shared
        bound: it needs no re-send and quantizes to about 2**31 / islands at the exponent derived from it. Re-sends
        that other islands' values force raise the exponent; the flag stays nonzero while they raise the bound
        less than 2**31-fold (where the finite elements' quantization step is larger than the bound)."""
        values = staged[:size]
        # min and max: NaN and infinity show in them, with no temporary the size of the bucket.
        if size and not (math.isfinite(values.min()) and math.isfinite(values.max())):
            values[:] = 0
            assert self.exchange is not None, "only rank 0, which has the exchange, stages buckets"
            staged[size + self.islands.index(self.island)] = self.exchange.bound


def global_clique(schedule: "ScheduleFile") -> "tuple[list[str], str | None, Tree | None]":
    """(members, aggregator city, tree) of the schedule's first clique of every island (a loaded schedule file):
    where the hook sums, as `InwireHookState`'s `islands`, `aggregator` and `tree`."""
    for cliques, trees in zip(schedule.period, schedule.trees or [()] * len(schedule.period)):
        for index, (members, aggregator) in enumerate(cliques):
            if set(members) == set(schedule.islands):
                return list(members), aggregator, (trees[index] if trees else None)
    raise ValueError("the DDP hook sums across every island, but the schedule has no clique of all of them "
                     "(inwire schedule --global-clique writes one)")


# torch's register_comm_hook compares these two annotations with dist.GradBucket and Future[Tensor] themselves.
def inwire_hook(state: InwireHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket's gradients averaged over every rank of every island."""
    tensor = bucket.buffer()
    if tensor.layout != torch.strided:
        # Before the island's all-reduce: every rank holds the same layout, so every rank refuses alike.
        raise ValueError(f"step {state.step}, bucket {bucket.index()}: sparse gradients ({tensor.layout}; "
                         f"nn.Embedding or nn.EmbeddingBag with sparse=True): the hook sums dense buckets only, "
                         f"build the model with sparse=False")
    index = bucket.index()
    if index >= state.buckets:
        raise ValueError(f"bucket {index} of a model with more than the {state.buckets} buckets the hook's state "
                         f"allows; raise InwireHookState(buckets=) or DDP's bucket_cap_mb")
    reduced = None
    if dist.get_world_size(state.group) > 1:
        reduced = dist.all_reduce(tensor, group=state.group, async_op=True).get_future()
    stream = torch.cuda.current_stream(tensor.device) if tensor.is_cuda else None
    summed: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    # Rank 0 sends them (its worker records what was agreed). The bucket's previous step has completed (DDP
    # waits for every future before the step ends), so its agreement, if any, is recorded by now.
    words = layout_words(bucket.parameters(), None, state.schedule)
    agreed = state.agreed.get(index) == words.tobytes()
    state.submit(_Job(state.step, index, tensor, reduced, summed, stream, None if agreed else words))
    if bucket.is_last():
        state.step += 1
    # A future given an exception holds it as its value, which DDP would read as the gradients ("Unable to cast
    # ... to Tensor"); a callback that raises it fails the future DDP waits on, so backward raises the error.
    return summed.then(_value)


def _value(future: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
    """The summed bucket, or the worker's error raised."""
    return future.value()


def _on(stream: "torch.cuda.Stream | None") -> contextlib.AbstractContextManager[object]:
    """Work queued on the CUDA stream the bucket's gradients were computed on; on CPU, nothing to choose."""
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def _first_rank(group: dist.ProcessGroup | None) -> int:
    """The global rank of the island's rank 0 (`group` None: the default group's)."""
    group = group or dist.group.WORLD
    assert group is not None, "torch.distributed is initialized"
    return dist.get_global_rank(group, 0)
