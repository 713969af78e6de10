"""docs/training.md's three ways in run as written: its setup block, then the averager's, the outer
optimizer's or the hook's block, in two islands (one-rank gloo jobs in their own processes) against
`inwire serve`'s engine on loopback; only the line naming the island differs between them."""

import contextlib
import json
import multiprocessing
import pathlib
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from inwire.codec_average import clique_average  # noqa: E402
from inwire.serve import SoftwareAggregator, serving_in_thread  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
ISLANDS = ("LON", "NYC")
WAYS = ("averager", "outer optimizer", "hook")
NAMING = 'island = "LON"'
STEPS = 50


def blocks():
    """The Python blocks of the section "Three ways in": setup, then one per way."""
    text = (ROOT / "docs" / "training.md").read_text()
    section = re.search(r"\n## Three ways in\n(.*?)\n## ", text, re.S).group(1)
    found = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(found) == 1 + len(WAYS) and found[0].count(NAMING) == 1, "the section's blocks changed shape"
    return found


def island_process(name, folder, out):
    """One island: each way in its own folder (its schedule and aggregator map, fresh services), from the
    same initial model, on this island's own data; records parameters and what the averager sent."""
    import os

    import torch.distributed as dist

    from inwire.train.averaging import CliqueAverager

    torch.set_num_threads(1)
    # What the averager sent is checked below; the class-wide switch reaches the averager the block makes.
    CliqueAverager.keep_vectors = True
    setup, *ways = blocks()
    store = dist.FileStore(str(pathlib.Path(folder) / f"{name}.store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    generator = torch.Generator().manual_seed(ISLANDS.index(name))
    data = [(torch.randn(8, 20, generator=generator), torch.randint(3, (8,), generator=generator))
            for _ in range(STEPS)]
    records = {}
    try:
        for way, block in zip(WAYS, ways):
            os.chdir(pathlib.Path(folder) / way / name)
            torch.manual_seed(0)
            model = torch.nn.Linear(20, 3)
            scope = {"model": model, "ddp_model": torch.nn.parallel.DistributedDataParallel(model),
                     "optimizer": torch.optim.SGD(model.parameters(), lr=0.1), "data": data,
                     "loss_fn": torch.nn.functional.cross_entropy}
            exec(setup.replace(NAMING, f'island = "{name}"'), scope)
            try:
                exec(block, scope)
            finally:
                scope["exchange"].close()
            records[f"{way}/parameters"] = torch.nn.utils.parameters_to_vector(model.parameters()).detach().numpy()
            if "averager" in scope:
                averager = scope["averager"]
                records[f"{way}/sent"] = averager.last[2]
                records[f"{way}/rounds_done"] = np.array(averager.rounds_done)
        np.savez(out, **records)
    finally:
        dist.destroy_process_group()


def test_the_three_ways_in_run_as_written(tmp_path):
    """Averager: the islands end with the codec's average of what they sent at the last averaging (the
    5th); outer optimizer: one averaging in 50 steps, state saved and loaded, islands alike; hook: islands on
    different data step alike. Each way fails if its block does not average across the islands."""
    services = []
    for k, way in enumerate(WAYS):
        first = SoftwareAggregator((f"127.0.0.{2 + 2 * k}", 0), unicast=True, log=lambda line: None)
        second = SoftwareAggregator((f"127.0.0.{3 + 2 * k}", first.address[1]), unicast=True, log=lambda line: None)
        services += [first, second]
        cities = {"LON": first.address, "NYC": second.address}
        for name in ISLANDS:
            folder = tmp_path / way / name
            folder.mkdir(parents=True)
            (folder / "schedule.json").write_text(json.dumps({"islands": list(ISLANDS), "rounds": [
                {"cliques": [{"members": list(ISLANDS), "aggregator": "NYC"}], "time_ms": 1.0}]}))
            (folder / "aggregators.json").write_text(json.dumps({city: f"{host}:{port}"
                                                                 for city, (host, port) in cities.items()}))
    context = multiprocessing.get_context("spawn")
    with contextlib.ExitStack() as stack:
        for service in services:
            stack.enter_context(serving_in_thread(service))
        processes = [context.Process(target=island_process, args=(name, str(tmp_path), str(tmp_path / f"{name}.npz")))
                     for name in ISLANDS]
        for process in processes:
            process.start()
        for process in processes:
            process.join(timeout=180)
        assert [process.exitcode for process in processes] == [0, 0]
        counters = [service.counters() for service in services]
    got = {name: dict(np.load(tmp_path / f"{name}.npz")) for name in ISLANDS}
    lon, nyc = got["LON"], got["NYC"]
    assert int(lon["averager/rounds_done"]) == STEPS // 10 and int(lon["outer optimizer/rounds_done"]) == 1
    average = clique_average([lon["averager/sent"], nyc["averager/sent"]])
    assert np.array_equal(lon["averager/parameters"], average) and np.array_equal(nyc["averager/parameters"], average)
    for way in WAYS:
        assert np.array_equal(lon[f"{way}/parameters"], nyc[f"{way}/parameters"]), way
    # Every way summed at NYC's service, the clique's aggregator city, and none at LON's.
    for k, way in enumerate(WAYS):
        assert counters[2 * k].get("accumulated", 0) == 0 and counters[2 * k + 1]["accumulated"] > 0, way
