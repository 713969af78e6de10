"""The DDP communication hook: islands as separate DistributedDataParallel jobs whose gradient buckets are
averaged across islands through `inwire serve`; every rank of every island ends with the codec's average of
the island means, bit for bit."""

import multiprocessing
import pathlib
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from inwire.codec_average import clique_average  # noqa: E402
from inwire.serve import SoftwareAggregator, serving_in_thread  # noqa: E402

ISLANDS = ("LON", "NYC", "SIN")
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
STEPS = 3


def build_model():
    torch.manual_seed(0)
    # Small buckets: several per step, so bucket indices and the step counter both name sums.
    return torch.nn.Sequential(torch.nn.Linear(40, 300), torch.nn.ReLU(), torch.nn.Linear(300, 40),
                               torch.nn.ReLU(), torch.nn.Linear(40, 5))


def batch(island, step):
    generator = torch.Generator().manual_seed(1000 * ISLANDS.index(island) + step)
    return torch.randn(16, 40, generator=generator), torch.randint(5, (16,), generator=generator)


def island_process(island, address, folder, out):
    """One island: a one-rank gloo job running DDP with the hook (recorded: what each bucket held before and
    after); writes the records and the final parameters."""
    import torch.distributed as dist

    from inwire.train.averaging import InwireExchange
    from inwire.train.ddp import InwireHookState, inwire_hook

    torch.set_num_threads(1)
    store = dist.FileStore(str(pathlib.Path(folder) / f"{island}.store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    batches = []

    class Counting(InwireExchange):
        """Notes how many buckets each of the worker's calls sums together."""

        def average_many(self, averagings, *args, **kwargs):
            batches.append(len(averagings))
            return super().average_many(averagings, *args, **kwargs)

    exchange = Counting(tuple(address), deadline_s=30)
    records = {}
    handed, completed = [], []

    def recording_hook(state, bucket):
        step, index = state.step, bucket.index()
        records[f"{step}-{index}-before"] = bucket.buffer().clone().numpy()
        handed.append((step, index))

        def record(future):
            records[f"{step}-{index}-after"] = future.value().numpy().copy()
            completed.append((step, index))
            return future.value()
        return inwire_hook(state, bucket).then(record)

    try:
        model = torch.nn.parallel.DistributedDataParallel(build_model(), bucket_cap_mb=0.02)
        model.register_comm_hook(InwireHookState(exchange, island, ISLANDS), recording_hook)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(STEPS):
            inputs, labels = batch(island, step)
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(inputs), labels).backward()
            optimizer.step()
        records["parameters"] = torch.nn.utils.parameters_to_vector(model.parameters()).detach().numpy()
        records["handed"], records["completed"] = np.array(handed), np.array(completed)
        records["batches"] = np.array(batches)
        np.savez(out, **records)
    finally:
        exchange.close()
        dist.destroy_process_group()


def run_processes(target, arguments):
    """`target(*args)` for each of `arguments`, each in a spawned process, all at once; each must exit 0."""
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=target, args=args) for args in arguments]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=180)
    assert all(process.exitcode == 0 for process in processes), [p.exitcode for p in processes]


def test_every_island_steps_with_the_codec_average_of_the_island_gradients(tmp_path):
    """Each bucket of each step leaves every island as the codec's average of what the islands put in, the
    buckets completing in the order they were handed over, those handed over during a sum summed together
    next; so the islands, started alike, stay bit-identical while their data differ."""
    with serving_in_thread(SoftwareAggregator(("127.0.0.1", 0), unicast=True, log=lambda line: None)) as server:
        run_processes(island_process, [(island, server.address, str(tmp_path), str(tmp_path / f"{island}.npz"))
                                       for island in ISLANDS])
    got = {island: dict(np.load(tmp_path / f"{island}.npz")) for island in ISLANDS}
    sums = sorted(key[:-len("-before")] for key in got["LON"] if key.endswith("-before"))
    assert len(sums) > STEPS  # several buckets a step
    for island in ISLANDS:  # the futures complete in the order DDP handed the buckets over
        assert np.array_equal(got[island].pop("completed"), got[island].pop("handed")), island
    # Buckets handed over while earlier ones were summed went out together, however each island grouped them.
    batches = {island: got[island].pop("batches") for island in ISLANDS}
    assert all(batches[island].sum() == len(sums) for island in ISLANDS), batches
    assert any(batches[island].max() > 1 for island in ISLANDS), batches
    for name in sums:
        assert {tuple(sorted(k for k in got[i] if k.startswith(name))) for i in ISLANDS} == {(f"{name}-after",
                                                                                               f"{name}-before")}
        average = clique_average([got[island][f"{name}-before"] for island in ISLANDS])
        for island in ISLANDS:
            assert np.array_equal(got[island][f"{name}-after"], average), (island, name)
    assert not np.array_equal(got["LON"]["0-0-before"], got["NYC"]["0-0-before"])
    for island in ISLANDS:
        assert np.array_equal(got[island]["parameters"], got["LON"]["parameters"])


class Bucket:
    """What the hook reads of a DDP gradient bucket: by default it holds one parameter of the buffer's shape."""

    def __init__(self, tensor, index, shapes=None):
        self.tensor, self._index = tensor, index
        self.shapes = [tuple(tensor.shape)] if shapes is None else shapes

    def buffer(self):
        return self.tensor

    def parameters(self):
        return [torch.empty(shape) for shape in self.shapes]

    def index(self):
        return self._index

    def is_last(self):
        return True


def hook_threads():
    """The names of the hook's worker threads still running once they have had the time to end."""
    for thread in threading.enumerate():
        if thread.name.startswith("inwire-hook"):
            thread.join(timeout=30)  # a bound on a hang, not a measurement
    return [thread.name for thread in threading.enumerate() if thread.name.startswith("inwire-hook")]


def held_islands(folder, device, out):
    """Two islands in one process, LON and NYC, each with its exchange, hand the hook one bucket each while the
    aggregator is held back (it serves only once released): whether each future was done when its hook
    returned, then the sums once released, the codec's average of the two buckets, and leftover threads."""
    import torch.distributed as dist

    from inwire.train.averaging import InwireExchange
    from inwire.train.ddp import InwireHookState, inwire_hook

    store = dist.FileStore(str(pathlib.Path(folder) / "held.store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    released = threading.Event()
    server = SoftwareAggregator(("127.0.0.1", 0), unicast=True, log=lambda line: None)

    def serve_once_released():
        released.wait()
        server.serve()

    generator = torch.Generator().manual_seed(7)
    gradients = {island: torch.randn(1000, generator=generator) for island in ("LON", "NYC")}
    with serving_in_thread(server, serve_once_released):
        exchanges = {island: InwireExchange(server.address, deadline_s=5.0) for island in gradients}
        try:
            futures, done = {}, {}
            try:
                for island, gradient in gradients.items():
                    state = InwireHookState(exchanges[island], island, list(gradients))
                    futures[island] = inwire_hook(state, Bucket(gradient.clone().to(device), 0))
                    done[island] = futures[island].done()
            finally:
                released.set()
            sums = {island: future.wait().cpu().numpy().copy() for island, future in futures.items()}
            expected = clique_average([gradient.numpy() for gradient in gradients.values()])
            out.put(("summed", done, sums, expected, hook_threads()))
        except Exception as error:  # what the hook raised, reported to the test
            out.put((type(error).__name__, str(error), None, None, hook_threads()))
        finally:
            for exchange in exchanges.values():
                exchange.close()
            dist.destroy_process_group()


@pytest.mark.parametrize("device", DEVICES)
def test_the_hook_returns_before_the_bucket_is_summed(tmp_path, device):
    """The hook hands the bucket to its worker and returns: with the aggregator held back, both islands'
    hooks return futures that are not done (a blocking hook would wait for a sum that cannot come), and once
    the aggregator serves, both futures hold the codec's average of the two buckets, and no worker is left.
    Where CUDA is present the buckets are on the GPU too (the worker on the buckets' stream)."""
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    process = context.Process(target=held_islands, args=(str(tmp_path), device, out))
    process.start()
    kind, done, sums, expected, threads = out.get(timeout=60)
    process.join(timeout=30)
    assert kind == "summed", done
    assert done == {"LON": False, "NYC": False}
    for island, got in sums.items():
        assert np.array_equal(got, expected), island
    assert threads == []


def lone_island(address, folder, buckets, out):
    """LON, one rank, sums its last bucket with NYC, which never comes: what the hook raised."""
    import torch.distributed as dist

    from inwire.train.averaging import InwireExchange
    from inwire.train.ddp import InwireHookState, inwire_hook

    store = dist.FileStore(str(pathlib.Path(folder) / "lone.store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    exchange = InwireExchange(tuple(address), deadline_s=2.0, timeout_s=0.05)
    try:
        state = InwireHookState(exchange, "LON", ["LON", "NYC"], buckets=buckets)
        returned = False
        try:
            future = inwire_hook(state, Bucket(torch.ones(1000), state.buckets - 1))
            returned = True
            future.wait()
            out.put(("no error", "", (), returned, hook_threads()))
        except Exception as error:  # what the hook or its future raised, reported to the test
            # The future's error wraps the exchange's, which the state keeps as raised.
            failure = state.failure[2] if returned and state.failure is not None else error
            out.put((type(failure).__name__, str(failure), tuple(getattr(failure, "missing", ())), returned,
                     hook_threads()))
    finally:
        exchange.close()
        dist.destroy_process_group()


@pytest.mark.parametrize("buckets, named", [(None, True), (16, False)])
def test_the_hook_names_a_missing_island_with_its_default_buckets(tmp_path, buckets, named):
    """With the default bucket count the roll call's records fit the service's default slots beside every
    bucket's sums, so the hook's failure names the island that never came, even for its last bucket; with
    16 buckets (4 x 16 x 4 = every one of the 256 slots) the aggregator cannot keep them and the failure
    says it cannot tell, and that the roll call needs more slots than the service's default."""
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    with serving_in_thread(SoftwareAggregator(("127.0.0.1", 0), unicast=True, log=lambda line: None)) as server:
        process = context.Process(target=lone_island, args=(server.address, str(tmp_path), buckets, out))
        process.start()
        kind, message, missing, returned, threads = out.get(timeout=60)
        process.join(timeout=30)
    # The exchange fails on the hook's worker: the hook has returned, its future carries the error, and the
    # worker has ended.
    assert returned and threads == [], (returned, threads)
    assert kind == "ClientError", message
    if named:
        assert missing == ("NYC",) and "no contribution of NYC arrived" in message, message
    else:
        assert missing == () and "answered neither the sum nor any of" in message, message
        assert "roll calls, whose records need 288 slots, more than inwire serve's default 256" in message, message


def lone_ranks(rank, address, folder, out):
    """Rank `rank` of LON, two ranks, training through the hook with NYC, which never comes: how many bucket
    hooks returned, what backward raised, and the hook's threads left."""
    import torch.distributed as dist

    from inwire.train.averaging import InwireExchange
    from inwire.train.ddp import InwireHookState, inwire_hook

    torch.set_num_threads(1)
    store = dist.FileStore(str(pathlib.Path(folder) / "lone-ranks.store"), 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    exchange = InwireExchange(tuple(address), deadline_s=2.0, timeout_s=0.05) if rank == 0 else None
    returned = []

    def counting_hook(state, bucket):
        future = inwire_hook(state, bucket)
        returned.append(bucket.index())
        return future

    state = None
    try:
        # DDP's first backward sums one bucket of everything unless it looks for unused parameters; that also
        # puts DDP's own all-reduce of the used parameters beside the hook's collectives.
        model = torch.nn.parallel.DistributedDataParallel(build_model(), bucket_cap_mb=0.02,
                                                          find_unused_parameters=True)
        state = InwireHookState(exchange, "LON", ["LON", "NYC"])
        model.register_comm_hook(state, counting_hook)
        inputs, labels = batch("LON", rank)
        try:
            torch.nn.functional.cross_entropy(model(inputs), labels).backward()
            out.put((rank, returned, "no error", (), hook_threads()))
        except Exception as error:  # what backward raised, reported to the test
            missing = tuple(getattr(state.failure[2], "missing", ())) if state.failure is not None else ()
            out.put((rank, returned, str(error), missing, hook_threads()))
    finally:
        if exchange is not None:
            exchange.close()
        dist.destroy_process_group()


def test_a_failed_sum_fails_backward_on_every_rank_after_every_bucket_was_handed_over(tmp_path):
    """The exchange fails on rank 0's worker (NYC never comes): every bucket's hook has returned by then, on
    both ranks (the sums were in flight together), and backward raises on both instead of hanging, rank 0
    naming the missing island and rank 1 its rank 0; no worker thread is left on either."""
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    with serving_in_thread(SoftwareAggregator(("127.0.0.1", 0), unicast=True, log=lambda line: None)) as server:
        processes = [context.Process(target=lone_ranks, args=(rank, server.address, str(tmp_path), out))
                     for rank in range(2)]
        for process in processes:
            process.start()
        got = {rank: rest for rank, *rest in (out.get(timeout=120) for _ in processes)}
        for process in processes:
            process.join(timeout=30)
    for rank, (returned, _, _, threads) in got.items():
        assert len(returned) > 1 and sorted(returned) == list(range(len(returned))), (rank, returned)
        assert threads == [], (rank, threads)
    assert got[0][0] == got[1][0]
    message = got[0][1]
    assert "ClientError: round 0 (agreement on what is averaged), clique 0 (LON, NYC): no result" in message, message
    assert f"from the aggregator at 127.0.0.1:{server.address[1]}" in message, message
    assert "no contribution of NYC arrived" in message and got[0][2] == ("NYC",), (message, got[0][2])
    assert "step 0, bucket 0: rank 0 of island LON could not sum it across islands" in got[1][1], got[1][1]


def sparse_island(folder, out):
    """One island, one rank, whose DDP model has sparse gradients: what its backward raised."""
    import torch.distributed as dist

    from inwire.train.averaging import InwireExchange
    from inwire.train.ddp import InwireHookState, inwire_hook

    store = dist.FileStore(str(pathlib.Path(folder) / "sparse.store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    exchange = InwireExchange(("127.0.0.1", 9), deadline_s=2.0)
    try:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.EmbeddingBag(10, 3, sparse=True))
        model.register_comm_hook(InwireHookState(exchange, "LON", ["LON", "NYC"]), inwire_hook)
        try:
            model(torch.tensor([[1, 2], [3, 4]])).sum().backward()
            out.put(("no error", ""))
        except Exception as error:  # what the backward raised, reported to the test
            out.put((type(error).__name__, str(error)))
    finally:
        exchange.close()
        dist.destroy_process_group()


def test_sparse_gradients_are_refused_naming_the_cause(tmp_path):
    """nn.EmbeddingBag(sparse=True) gives DDP sparse buckets, which the hook cannot sum: the backward raises
    one line that says so, not a traceback from inside torch."""
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    process = context.Process(target=sparse_island, args=(str(tmp_path), out))
    process.start()
    kind, message = out.get(timeout=60)
    process.join(timeout=30)
    assert kind == "ValueError" and "\n" not in message, (kind, message)
    assert "step 0, bucket 0: sparse gradients (torch.sparse_coo; nn.Embedding or nn.EmbeddingBag with sparse=True): " \
        "the hook sums dense buckets only, build the model with sparse=False" in message, (kind, message)


SCALED_ISLANDS = {"LON": 2, "NYC": 1}
"""Islands of the GradScaler test and their ranks: LON's mean is its two ranks' all-reduce."""
POISONED = {("LON", 1, 1), ("NYC", 0, 3)}
"""(island, rank, step) whose loss overflows to infinity: a rank without the exchange, then the other island."""
SCALED_STEPS = 5


def scaled_rank(island, rank, address, folder, out):
    """One rank of an island training with torch.amp.GradScaler through the hook; at its POISONED steps its
    loss is scaled past float32's range, so its gradients are infinite. Writes, per step, the parameters after
    the step and the scale after the update (and on rank 0 the hook's non-finite record)."""
    import torch.distributed as dist

    from inwire.train.averaging import InwireExchange
    from inwire.train.ddp import InwireHookState, inwire_hook

    torch.set_num_threads(1)
    ranks = SCALED_ISLANDS[island]
    store = dist.FileStore(str(pathlib.Path(folder) / f"{island}.store"), ranks)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=ranks)
    exchange = InwireExchange(tuple(address), deadline_s=30) if rank == 0 else None
    records = {}
    try:
        model = torch.nn.parallel.DistributedDataParallel(build_model(), bucket_cap_mb=0.02)
        state = InwireHookState(exchange, island, list(SCALED_ISLANDS))
        model.register_comm_hook(state, inwire_hook)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu")
        records["start"] = torch.nn.utils.parameters_to_vector(model.parameters()).detach().numpy().copy()
        for step in range(SCALED_STEPS):
            inputs, labels = batch(island, 10 * step + rank)
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(inputs), labels)
            if (island, rank, step) in POISONED:
                loss = loss * 1e38
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            records[f"{step}-parameters"] = torch.nn.utils.parameters_to_vector(
                model.parameters()).detach().numpy().copy()
            records[f"{step}-scale"] = np.float64(scaler.get_scale())
            if rank == 0 and state.non_finite is not None:
                records[f"{step}-non-finite"] = np.array(f"{state.non_finite[0]} {' '.join(state.non_finite[2])}")
        np.savez(out, **records)
    finally:
        if exchange is not None:
            exchange.close()
        dist.destroy_process_group()


def test_a_non_finite_bucket_on_one_island_makes_every_scaler_skip_the_step(tmp_path):
    """Mixed precision's loss scaling through the hook: a rank whose gradients overflow (LON's second rank at
    step 1, NYC's only rank at step 3) leaves the buckets non-finite on every rank of every island, as DDP's
    all-reduce does, so every GradScaler skips that step (parameters unchanged) and halves its scale; the
    other steps train, and every rank of every island ends each step with the same parameters and scale."""
    ranks = [(island, rank) for island, count in SCALED_ISLANDS.items() for rank in range(count)]
    with serving_in_thread(SoftwareAggregator(("127.0.0.1", 0), unicast=True, log=lambda line: None)) as server:
        run_processes(scaled_rank, [(island, rank, server.address, str(tmp_path),
                                     str(tmp_path / f"{island}-{rank}.npz")) for island, rank in ranks])
    got = {where: dict(np.load(tmp_path / f"{where[0]}-{where[1]}.npz")) for where in ranks}
    skipped = {step for _, _, step in POISONED}
    first = got[ranks[0]]
    scale = 65536.0
    before = first["start"]
    for step in range(SCALED_STEPS):
        if step in skipped:
            scale /= 2
        for where in ranks:
            assert np.array_equal(got[where][f"{step}-parameters"], first[f"{step}-parameters"]), (where, step)
            assert got[where][f"{step}-scale"] == scale, (where, step)
        after = first[f"{step}-parameters"]
        assert np.array_equal(after, before) == (step in skipped), step
        assert np.isfinite(after).all(), step
        before = after
    for island in SCALED_ISLANDS:
        named = {step: str(got[(island, 0)].get(f"{step}-non-finite", "")) for step in range(SCALED_STEPS)}
        assert named == {0: "", 1: "1 LON", 2: "1 LON", 3: "3 NYC", 4: "3 NYC"}, (island, named)


def mismatched_islands(folder, out):
    """LON's bucket 0 holds a (3, 4) weight and then its bias, NYC's the bias first (a submodule registered in
    another order): the same 16 gradients. What each island's hook raised, and whether its bucket kept its
    gradients."""
    import torch.distributed as dist

    from inwire.train.averaging import InwireExchange
    from inwire.train.ddp import InwireHookState, inwire_hook

    store = dist.FileStore(str(pathlib.Path(folder) / "mismatched.store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    shapes = {"LON": [(3, 4), (4,)], "NYC": [(4,), (3, 4)]}
    with serving_in_thread(SoftwareAggregator(("127.0.0.1", 0), unicast=True, log=lambda line: None)) as server:
        exchanges = {island: InwireExchange(server.address, deadline_s=10.0) for island in shapes}
        try:
            states, futures, gradients, buffers = {}, {}, {}, {}
            for seed, island in enumerate(shapes):
                gradients[island] = torch.randn(16, generator=torch.Generator().manual_seed(seed))
                buffers[island] = gradients[island].clone()
                states[island] = InwireHookState(exchanges[island], island, list(shapes))
                futures[island] = inwire_hook(states[island], Bucket(buffers[island], 0, shapes[island]))
            got = {}
            for island, future in futures.items():
                try:
                    future.wait()
                    got[island] = ("no error", "")
                except Exception:  # the state keeps the worker's error as raised
                    failure = states[island].failure[2]
                    got[island] = (type(failure).__name__, str(failure))
            untouched = {island: bool(torch.equal(buffers[island], gradients[island])) for island in shapes}
            out.put((got, untouched, hook_threads()))
        finally:
            for exchange in exchanges.values():
                exchange.close()
            dist.destroy_process_group()


def test_islands_whose_buckets_hold_other_parameters_fail_every_backward_before_any_sum(tmp_path):
    """DDP fixes a bucket's layout from the model; an island that registered a submodule in another order
    has buckets of the same size holding other parameters. Both islands' hooks fail with one message naming
    the island that differs, before the bucket is summed."""
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    process = context.Process(target=mismatched_islands, args=(str(tmp_path), out))
    process.start()
    got, untouched, threads = out.get(timeout=60)
    process.join(timeout=30)
    messages = {message for _, message in got.values()}
    assert {kind for kind, _ in got.values()} == {"LayoutMismatch"} and len(messages) == 1, got
    message = messages.pop()
    assert message.startswith("step 0, bucket 0 (LON, NYC): island NYC averages the same parameter shapes in another "
                              "order, compared with LON (layout digest "), message
    assert message.endswith("; nothing was averaged"), message
    assert untouched == {"LON": True, "NYC": True} and threads == []
