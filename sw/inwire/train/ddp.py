"""A DistributedDataParallel communication hook that sums gradients across islands through inwire.

Synchronous data parallelism across islands, SwitchML's use case, in the shape DDP users know:

    state = InwireHookState(exchange, island="LON", islands=["LON", "NYC", "SIN"])   # exchange: rank 0 only
    ddp_model.register_comm_hook(state, inwire_hook)

Each gradient bucket is first averaged inside the island on the island's own backend (gloo or NCCL, the
process group DDP runs on), then its rank 0 averages the island means across islands through the
aggregator, as one clique of every island (the global clique, or the tree the schedule gives it through
`aggregator` and `tree`), with the codec's shared exponent and its overflow re-send; the result is broadcast
back inside the island and the future returns it. Every island gets the same bits: the codec's average of
the island means (`codec_average.clique_average`). The hook blocks until the bucket is summed, so buckets are
summed one after the other; a bucket's sum is named by the step and the bucket's index (round and clique
fields), so islands whose buckets become ready in another order still meet in the same slots. Every island
must build the same buckets (the same model and `bucket_cap_mb`), as every rank of one DDP job does.
Buckets anywhere (CPU or CUDA) are staged through one reusable float32 host buffer (pinned where CUDA is
present), as `CliqueAverager` stages parameters.
"""

import numpy as np
import torch
import torch.distributed as dist

from ..client import DEFAULT_WINDOW, SLOT_POOLS, ClientError
from ..serve import DEFAULT_SLOTS
from .codec_average import AveragingError


def default_buckets(islands):
    """The most buckets whose sums (4 x buckets x the default window slots, `client.slots_needed`) and roll-call
    records (one per island per bucket, `client.presence_slot`) fit the service's default slots: so that a
    missing island can be named."""
    return DEFAULT_SLOTS // (SLOT_POOLS * DEFAULT_WINDOW + islands)


class InwireHookState:
    """What `inwire_hook` needs: rank 0's `exchange` (an `InwireExchange`; None on the other ranks), this
    island's name and every island's (the global clique, in one order on every island), the island's
    process group (None: the default group), and the clique's aggregator city and tree when the exchange
    has per-city aggregators. `buckets` bounds the buckets of the model (the slot layout's stride: 4 x
    buckets x the exchange's window slots at the aggregator; DDP's default 25 MB buckets give one per 25 MB
    of gradients); None: `default_buckets` (13 for 3 islands, 10 for 9)."""

    def __init__(self, exchange, island, islands, process_group=None, aggregator=None, tree=None, buckets=None):
        islands = list(islands)
        if island not in islands:
            raise ValueError(f"island {island!r} is not one of {', '.join(islands)}")
        if buckets is None:
            buckets = default_buckets(len(islands))
        self.exchange, self.island, self.islands = exchange, island, islands
        self.group = process_group
        self.aggregator, self.tree = aggregator, tree
        self.step = 0
        self.buckets = buckets
        if dist.get_rank(process_group) == 0 and exchange is None:
            raise ValueError("the island's rank 0 needs an exchange to reach inwire")
        self.host = None
        """The reusable host buffer buckets are staged through (pinned where CUDA is present); it grows to the
        largest bucket."""
        self.last = None
        """On rank 0: (step, bucket index, island mean sent, average received) of the latest bucket, for logs
        and checks; the island mean is a view of the host buffer, valid until the next bucket."""

    def stage(self, tensor):
        """The bucket as a float32 numpy vector in the host buffer, whatever its device and dtype."""
        if self.host is None or self.host.numel() < tensor.numel():
            self.host = torch.empty(tensor.numel(), dtype=torch.float32, pin_memory=torch.cuda.is_available())
        staged = self.host[:tensor.numel()]
        staged.copy_(tensor.detach().reshape(-1))
        return staged.numpy()


def global_clique(schedule):
    """(members, aggregator city, tree) of the schedule's first clique of every island (a loaded schedule file):
    where the hook sums, as `InwireHookState`'s `islands`, `aggregator` and `tree`."""
    for cliques, trees in zip(schedule.period, schedule.trees or [()] * len(schedule.period)):
        for index, (members, aggregator) in enumerate(cliques):
            if set(members) == set(schedule.islands):
                return list(members), aggregator, (trees[index] if trees else None)
    raise ValueError("the DDP hook sums across every island, but the schedule has no clique of all of them "
                     "(inwire schedule --global-clique writes one)")


def inwire_hook(state, bucket):
    """DDP communication hook: the bucket's gradients averaged over every rank of every island."""
    tensor = bucket.buffer()
    if tensor.layout != torch.strided:
        # Before the island's all-reduce: every rank holds the same layout, so every rank refuses alike.
        raise ValueError(f"step {state.step}, bucket {bucket.index()}: sparse gradients ({tensor.layout}; "
                         f"nn.Embedding or nn.EmbeddingBag with sparse=True): the hook sums dense buckets only, "
                         f"build the model with sparse=False")
    group = state.group
    world = dist.get_world_size(group)
    dist.all_reduce(tensor, group=group)
    tensor.div_(world)
    index = bucket.index()
    if index >= state.buckets:
        raise ValueError(f"bucket {index} of a model with more than the {state.buckets} buckets the hook's state "
                         f"allows; raise InwireHookState(buckets=) or DDP's bucket_cap_mb")
    error = None
    if dist.get_rank(group) == 0:
        host = state.stage(tensor)
        try:
            average = state.exchange.average(state.step, index, state.islands, state.islands.index(state.island),
                                             host, aggregator=state.aggregator, tree=state.tree,
                                             max_cliques=state.buckets)
            state.last = (state.step, index, host, average)
            tensor.copy_(torch.from_numpy(np.ascontiguousarray(average)).view_as(tensor))
        except (AveragingError, ClientError, OSError, ValueError) as failure:
            error = failure
    if world > 1:
        device = tensor.device if dist.get_backend(group) == "nccl" else torch.device("cpu")
        status = torch.tensor([0 if error is None else 1], dtype=torch.int32, device=device)
        dist.broadcast(status, src=dist.get_global_rank(group or dist.group.WORLD, 0), group=group)
        if int(status.item()) != 0 and error is None:
            error = AveragingError(f"step {state.step}, bucket {index}: rank 0 of island {state.island} could not "
                                   f"sum it across islands")
        if error is None:
            dist.broadcast(tensor, src=dist.get_global_rank(group or dist.group.WORLD, 0), group=group)
    if error is not None:
        raise error
    if bucket.is_last():
        state.step += 1
    future = torch.futures.Future()
    future.set_result(tensor)
    return future
