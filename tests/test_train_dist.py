"""Islands as torchrun jobs (2 gloo ranks each) averaging through the software aggregator on loopback."""

import json
import shutil

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")

from inwire.train.dist import DistributedRunError, check_bit_exact, launch_islands, run_dist  # noqa: E402
from inwire.train.island import digest  # noqa: E402

ISLANDS = ("LON", "NYC", "SIN")


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """3 islands x 2 ranks, 20 steps, rotating pairs (so islands also sit rounds out)."""
    out = tmp_path_factory.mktemp("dist")
    return run_dist(ISLANDS, nproc=2, steps=20, period=5, strategy="gossip", model_mb=1, out_dir=out, timeout_s=240)


def test_torchrun_islands_end_bit_exact_with_the_codec(small_run):
    assert small_run["bit_exact"], small_run["problems"]
    assert small_run["problems"] == []
    for island, result in small_run["islands"].items():
        assert result["ranks"] == 2 and result["backend"] == "gloo", island
        assert 0 < result["accuracy"] <= 1
    # 4 rounds of one pair each: every island averages in some rounds and sits the others out.
    counts = sorted(result["averagings"] for result in small_run["islands"].values())
    assert sum(counts) == 4 * 2 and counts[0] < 4
    assert small_run["averagings_checked"] == 8


def test_the_check_catches_one_rank_off_by_one_ulp(small_run, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(small_run["out_dir"], copy)
    path = copy / "NYC-rank1.npz"
    log = dict(np.load(path))
    average = dict(np.load(copy / "NYC-rank0.npz"))["average"][0].copy()
    average[3] = np.nextafter(average[3], np.float32(9))
    log["average_sha"] = log["average_sha"].copy()
    log["average_sha"][0] = digest(average)
    np.savez(path, **log)
    bit_exact, _, problems = check_bit_exact(copy, ISLANDS)
    assert not bit_exact and problems == ["NYC rank 1: average differs from rank 0"]
    for name in ISLANDS:
        path = copy / f"{name}-rank0.npz"
        log = dict(np.load(path))
        log["average"] = log["average"] * np.float32(1.0000001)
        np.savez(path, **log)
    assert any("differs from the codec's" in p for p in check_bit_exact(copy, ISLANDS)[2])


def test_an_unreachable_aggregator_fails_in_bounded_time(tmp_path):
    """Rank 0 gives up after its deadline and tells rank 1, which raises instead of waiting: no hang."""
    schedule = tmp_path / "schedule.json"
    schedule.write_text(json.dumps({"islands": ["LON", "NYC"], "rounds": [
        {"cliques": [{"members": ["LON", "NYC"], "aggregator": "LON"}], "time_ms": 1.0}]}))
    with pytest.raises(DistributedRunError, match="island LON exited with status") as failure:
        launch_islands(["LON"], "127.0.0.1:9", schedule, tmp_path, 2, 5, 5, 0, "0.3", timeout_s=40)
    # The error shows the cause, not only torchrun's summary: rank 1 heard from rank 0 why it stopped.
    assert "[rank0]: " in str(failure.value) and "no result for chunk" in str(failure.value)
    assert "[rank1]: inwire.train.codec_average.AveragingError: round 0: rank 0 of island LON could not average" \
        in str(failure.value)


def test_a_missing_island_is_named_on_every_rank_of_the_others(tmp_path):
    """LON and SIN (2 ranks each) average with NYC, which never starts: rank 0 fails at its deadline naming
    NYC (the roll call at the aggregator), and tells rank 1, whose error names NYC too."""
    from inwire.serve import SoftwareAggregator, serving_in_thread

    schedule = tmp_path / "schedule.json"
    schedule.write_text(json.dumps({"islands": list(ISLANDS), "rounds": [
        {"cliques": [{"members": list(ISLANDS), "aggregator": "LON"}], "time_ms": 1.0}]}))
    with serving_in_thread(SoftwareAggregator(("127.0.0.1", 0), unicast=True, log=lambda line: None)) as server:
        with pytest.raises(DistributedRunError, match="exited with status") as failure:
            launch_islands(["LON", "SIN"], f"127.0.0.1:{server.address[1]}", schedule, tmp_path, 2, 5, 5, 0, "0.3",
                           timeout_s=40)
    text = str(failure.value)
    assert "[rank0]: inwire.client.ClientError: " in text and "[rank1]: inwire.train.codec_average.AveragingError" \
        in text, text
    for rank in ("[rank0]", "[rank1]"):
        assert any(line.startswith(rank) and "no contribution of NYC arrived" in line for line in text.splitlines()), \
            text


def test_torchrun_islands_sum_along_a_tree_of_chained_services(tmp_path):
    """The global clique LON -> NYC -> SIN: NYC's service sums LON's and its own and sends the partial to
    SIN's, the root; 2 ranks per island, bit-exact at every averaging."""
    report = run_dist(ISLANDS, nproc=2, steps=10, period=5, strategy="tree", hidden=200, out_dir=tmp_path,
                      timeout_s=240)
    assert report["bit_exact"], report["problems"]
    assert report["averagings_checked"] == 2 * len(ISLANDS)
    counters = report["aggregator_counters"]
    assert sorted(counters) == ["NYC", "SIN"]
    assert counters["NYC"]["partials_emitted"] > 0 and counters["SIN"]["results_emitted"] > 0
    assert "partials_emitted" not in counters["SIN"]
