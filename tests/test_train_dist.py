"""Islands as torchrun jobs (2 gloo ranks each) averaging, or training through the DDP hook, across
`inwire serve` processes on loopback."""

import dataclasses
import json
import re
import shutil

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")

from inwire.codec_average import clique_average  # noqa: E402
from inwire.train.dist import DistributedRunError, check_bit_exact, launch_islands, main, run_dist  # noqa: E402
from inwire.train.island import digest, load_log, save_log  # noqa: E402

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
    log = load_log(path)
    average = load_log(copy / "NYC-rank0.npz")["average"][0].copy()
    average[3] = np.nextafter(average[3], np.float32(9))
    log["average_sha"] = log["average_sha"].copy()
    log["average_sha"][0] = digest(average)
    save_log(path, log)
    bit_exact, _, problems = check_bit_exact(copy, ISLANDS)
    assert not bit_exact and problems == ["NYC rank 1: average differs from rank 0"]
    for name in ISLANDS:
        path = copy / f"{name}-rank0.npz"
        log = load_log(path)
        log["average"] = [vector * np.float32(1.0000001) for vector in log["average"]]
        save_log(path, log)
    assert any("differs from the codec's" in p for p in check_bit_exact(copy, ISLANDS)[2])


def test_an_unreachable_aggregator_fails_in_bounded_time(tmp_path):
    """Rank 0 gives up after its deadline and tells rank 1, which raises instead of waiting: no hang."""
    schedule = tmp_path / "schedule.json"
    schedule.write_text(json.dumps({"islands": ["LON", "NYC"], "rounds": [
        {"cliques": [{"members": ["LON", "NYC"], "aggregator": "LON"}], "time_ms": 1.0}]}))
    with pytest.raises(DistributedRunError, match="island LON exited with status") as failure:
        launch_islands(["LON"], "127.0.0.1:9", schedule, tmp_path, 2, 5, 5, 0, "0.3", timeout_s=40, register=False)
    # The error shows the cause, not only torchrun's summary: rank 1 heard from rank 0 why it stopped.
    assert "[rank0]: " in str(failure.value) and "no result for chunk" in str(failure.value)
    assert "[rank1]: inwire.codec_average.AveragingError: round 0: rank 0 of island LON could not average" \
        in str(failure.value)


def test_a_launch_is_a_registered_job_and_an_aggregator_that_refuses_it_stops_it_before_any_island(tmp_path):
    """One aggregator: the launch registers a job of its islands' rank-0 sockets before starting them; an
    aggregator with too few slots for it refuses it in one line, and no island starts."""
    from inwire.control import ControlError
    from inwire.serve import SoftwareAggregator, serving_in_thread

    schedule = tmp_path / "schedule.json"
    schedule.write_text(json.dumps({"islands": ["LON", "NYC"], "rounds": [
        {"cliques": [{"members": ["LON", "NYC"], "aggregator": "LON"}], "time_ms": 1.0}]}))
    with serving_in_thread(SoftwareAggregator(("127.0.0.1", 0), engine="golden", registered=True, slots=8,
                                              log=lambda line: None)) as server:
        with pytest.raises(ControlError, match=r"refused the registration of job 5: job 5: no 18 free slots in a row "
                                               r"among this aggregator's 8"):
            launch_islands(["LON", "NYC"], f"127.0.0.1:{server.address[1]}", schedule, tmp_path, 2, 5, 5, 0, "0.3",
                           timeout_s=40, job=5)
    assert not list(tmp_path.glob("*.log"))


def test_a_launch_holds_its_members_places_and_each_island_registers_a_socket_of_its_own(tmp_path):
    """The launcher never names a port it probed and let go (another process could take it before the island
    binds it): the members its leases register are sockets it holds while the islands run, so no one else can
    bind them, and each island is told to register a socket of its own in the same entry, which the aggregator
    merges with the one it holds (a clash would be refused)."""
    import dataclasses
    import socket

    from inwire.control import JobLease, entry_from_json
    from inwire.datagram import ip_int, ip_str
    from inwire.serve import SoftwareAggregator, serving_in_thread
    from inwire.train.dist import registration
    from inwire.train.island import JOB_VARIABLE, REGISTER_VARIABLE

    schedule = tmp_path / "schedule.json"
    schedule.write_text(json.dumps({"islands": ["LON", "NYC"], "rounds": [
        {"cliques": [{"members": ["LON", "NYC"], "aggregator": "LON"}], "time_ms": 1.0}]}))
    with serving_in_thread(SoftwareAggregator(("127.0.0.1", 0), engine="golden", registered=True,
                                              log=lambda line: None)) as server:
        environments, lease = registration(["LON", "NYC"], f"127.0.0.1:{server.address[1]}", schedule, False, 5)
        entry = entry_from_json(json.loads(environments["LON"][JOB_VARIABLE]))
        assert entry.job == 5 and len(entry.members) == 2
        with lease:
            for address, port in entry.members:
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as other, pytest.raises(OSError):
                    other.bind((ip_str(address), port))
            for island in ("LON", "NYC"):
                ((aggregator, fields),) = json.loads(environments[island][REGISTER_VARIABLE])
                assert aggregator == f"127.0.0.1:{server.address[1]}"
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as own:
                    own.bind(("127.0.0.1", 0))
                    mine = dataclasses.replace(entry_from_json(fields), members={(ip_int("127.0.0.1"),
                                                                                  own.getsockname()[1])})
                    with JobLease(aggregator, mine) as joined:
                        assert list(joined.bases.values()) == [0]


def test_a_missing_island_is_named_on_every_rank_of_the_others(tmp_path):
    """LON and SIN (2 ranks each) average with NYC, which never starts: rank 0 fails at its deadline naming
    NYC (the roll call at the aggregator), and tells rank 1, whose error names NYC too."""
    from inwire.serve import SoftwareAggregator, serving_in_thread

    schedule = tmp_path / "schedule.json"
    schedule.write_text(json.dumps({"islands": list(ISLANDS), "rounds": [
        {"cliques": [{"members": list(ISLANDS), "aggregator": "LON"}], "time_ms": 1.0}]}))
    # Registered jobs only: the launch's islands average as members of its job.
    with serving_in_thread(SoftwareAggregator(("127.0.0.1", 0), unicast=True, engine="golden", registered=True,
                                              unregistered=False, log=lambda line: None)) as server:
        with pytest.raises(DistributedRunError, match="exited with status") as failure:
            launch_islands(["LON", "SIN"], f"127.0.0.1:{server.address[1]}", schedule, tmp_path, 2, 5, 5, 0, "0.3",
                           timeout_s=40)
    text = str(failure.value)
    assert "[rank0]: inwire.client.ClientError: " in text and "[rank1]: inwire.codec_average.AveragingError" \
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


@pytest.fixture(scope="module")
def hook_run(tmp_path_factory):
    """3 torchrun islands x 2 gloo ranks training synchronously through the DDP hook for 3 steps: every
    gradient bucket averaged inside the island, then summed across islands along the tree LON -> NYC -> SIN
    of two chained `inwire serve` processes (NYC sums LON's and its own, SIN is the root); every rank logs
    its own buckets, so the island means are checked too."""
    return run_dist(ISLANDS, nproc=2, steps=3, strategy="tree", hidden=200, hook=True, bucket_mb=0.005,
                    log_gradients=True,
                    out_dir=tmp_path_factory.mktemp("hook"), timeout_s=240)


def test_torchrun_islands_through_the_ddp_hook_get_the_codec_average_of_the_island_means(hook_run):
    """Every bucket of every step leaves every rank of every island as `clique_average` of the islands'
    means (rank 0's logged sent vectors, each the mean of its island's two ranks' buckets), the islands'
    means differ, and the islands end with the same parameters; the sums went through both services of the
    tree."""
    assert hook_run["bit_exact"], hook_run["problems"]
    assert hook_run["problems"] == [] and hook_run["mode"] == "ddp hook"
    sums = {island: result["averagings"] for island, result in hook_run["islands"].items()}
    # DDP's first step goes in one bucket, later steps in two once it has rebuilt them at the cap.
    assert len(set(sums.values())) == 1 and sums["LON"] == 1 + 2 * 2, sums
    assert hook_run["averagings_checked"] == sum(sums.values())
    for island, result in hook_run["islands"].items():
        assert result["ranks"] == 2 and result["backend"] == "gloo", island
    logs = {island: load_log(f"{hook_run['out_dir']}/{island}-rank0.npz") for island in ISLANDS}
    assert not np.array_equal(logs["LON"]["sent"][0], logs["NYC"]["sent"][0])
    assert len(logs["LON"]["sent"][0]) != len(logs["LON"]["sent"][1])  # buckets of their own sizes
    counters = hook_run["aggregator_counters"]
    assert sorted(counters) == ["NYC", "SIN"]
    assert counters["NYC"]["partials_emitted"] > 0 and counters["SIN"]["results_emitted"] > 0
    assert "partials_emitted" not in counters["SIN"]


def test_the_hook_check_catches_a_tampered_bucket(hook_run, tmp_path):
    """One rank's bucket one ulp off the average, or one island's mean changed (no longer its ranks'), is
    found."""
    copy = tmp_path / "copy"
    shutil.copytree(hook_run["out_dir"], copy)
    path = copy / "SIN-rank1.npz"
    log = load_log(path)
    tampered = clique_average([load_log(copy / f"{island}-rank0.npz")["sent"][2] for island in ISLANDS])
    tampered[0] = np.nextafter(tampered[0], np.float32(9))
    log["after_sha"] = log["after_sha"].copy()
    log["after_sha"][2] = digest(tampered)
    save_log(path, log)
    bit_exact, _, problems = check_bit_exact(copy, ISLANDS)
    assert not bit_exact and problems == ["SIN rank 1: after differs from rank 0"]
    shutil.rmtree(copy)
    shutil.copytree(hook_run["out_dir"], copy)
    path = copy / "LON-rank0.npz"
    log = load_log(path)
    log["sent"][1] = log["sent"][1] * np.float32(0.5)
    log["sent_sha"] = log["sent_sha"].copy()
    log["sent_sha"][1] = digest(log["sent"][1])
    save_log(path, log)
    bit_exact, _, problems = check_bit_exact(copy, ISLANDS)
    assert not bit_exact and problems[0] == f"LON round {log['round'][1]}: what rank 0 sent is not the mean of " \
        "the island's buckets"
    assert all("differs from the codec's" in problem or "is not the average" in problem
               for problem in problems[1:]) and len(problems) == 1 + 2 * len(ISLANDS)


def test_the_hook_refuses_a_schedule_without_a_clique_of_every_island(tmp_path, capsys):
    """Rotating pairs have no clique of all islands for the hook to sum in: one line, before any launch."""
    assert main(["--hook", "--strategy", "gossip", "--out-dir", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "the schedule has no clique of all of them" in error, error
    assert not list(tmp_path.glob("*.log"))


def one_island_run(tmp_path, monkeypatch, out_dir):
    """`python -m inwire.train.island` in this process: one rank of island LON, for fewer steps than its
    averaging period (no peer needed)."""
    import socket

    from inwire.train import island

    schedule = tmp_path / "schedule.json"
    schedule.write_text(json.dumps({"islands": ["LON", "NYC"], "rounds": [
        {"cliques": [{"members": ["LON", "NYC"], "aggregator": "LON"}], "time_ms": 1.0}]}))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1",
                        "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    return island.main(["--island", "LON", "--schedule", str(schedule), "--server", "127.0.0.1:9",
                        "--out-dir", str(out_dir), "--steps", "2", "--period", "5", "--timeout", "20",
                        "--job", "7"])


def test_an_island_makes_a_missing_out_dir_and_keeps_its_log(tmp_path, monkeypatch):
    out = tmp_path / "not" / "yet"
    assert one_island_run(tmp_path, monkeypatch, out) == 0
    assert load_log(out / "LON-rank0.npz")["round"].size == 0
    assert json.loads((out / "LON.json").read_text())["steps"] == 2


def test_an_island_refuses_an_out_dir_it_cannot_make_before_training(tmp_path, monkeypatch, capsys):
    (tmp_path / "taken").write_text("a file, not a folder")
    with pytest.raises(SystemExit) as exit_:
        one_island_run(tmp_path, monkeypatch, tmp_path / "taken" / "run")
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.endswith(f"--out-dir {tmp_path / 'taken' / 'run'}: cannot make the folder: Not a directory"), error


def test_an_island_has_no_fixed_default_job(tmp_path, capsys):
    """Two trainings on one aggregator with a default job 1 corrupted each other: an island is told its job
    (the launcher draws one per launch), and refuses to start without one."""
    from inwire.train import island

    with pytest.raises(SystemExit) as exit_:
        island.main(["--island", "LON", "--schedule", str(tmp_path / "schedule.json"), "--server", "127.0.0.1:9",
                     "--out-dir", str(tmp_path)])
    assert exit_.value.code == 2
    assert "the following arguments are required: --job" in capsys.readouterr().err


@pytest.mark.parametrize(("registrations", "bind", "message"), [
    ("not json", None, r"\$INWIRE_JOB_REGISTER: "),
    ('{"127.0.0.1:1": {}}', None, r"\$INWIRE_JOB_REGISTER: not a list of \[\"HOST:PORT\", entry\]"),
    ('[["127.0.0.1:1"]]', None, r"\$INWIRE_JOB_REGISTER: not a list of \[\"HOST:PORT\", entry\]"),
    ('[["127.0.0.1:1", {"job": 5}]]', None, r"\$INWIRE_JOB_REGISTER: field token is missing$"),
    ("OTHER_JOB", None, r"\$INWIRE_JOB_REGISTER holds job 6, \$INWIRE_JOB job 5"),
    ("SAME_JOB", "127.0.0.1:9", r"--bind 127.0.0.1:9: with \$INWIRE_JOB_REGISTER the island binds a port of its own"),
    ("NO_TOKEN_JOB", None, r"^.*: error: \$INWIRE_JOB: field token is missing$"),
])
def test_a_bad_registration_variable_is_one_line_naming_it_before_any_work(monkeypatch, tmp_path, capsys,
                                                                           registrations, bind, message):
    """$INWIRE_JOB_REGISTER (and $INWIRE_JOB) come from whoever starts the island: a malformed one (not JSON,
    not the shape, an entry missing a field), one of another job, or one beside --bind ends the island at its
    arguments with one line naming the variable (exit 2), nothing trained and no out-dir made."""
    from inwire.control import entry_to_json, new_job
    from inwire.train.island import JOB_VARIABLE, REGISTER_VARIABLE, parse_arguments

    entry = dataclasses.replace(new_job([("127.0.0.1", 9)], 4), job=5)
    entries = {"OTHER_JOB": dataclasses.replace(entry, job=6), "SAME_JOB": entry, "NO_TOKEN_JOB": entry}
    job = entry_to_json(entry)
    if registrations == "NO_TOKEN_JOB":  # $INWIRE_JOB itself without its token
        del job["token"]
    if registrations in entries:
        registrations = json.dumps([["127.0.0.1:1", entry_to_json(entries[registrations])]])
    monkeypatch.setenv(JOB_VARIABLE, json.dumps(job))
    monkeypatch.setenv(REGISTER_VARIABLE, registrations)
    out_dir = tmp_path / "out"
    argv = ["--island", "LON", "--schedule", "s.json", "--server", "127.0.0.1:1", "--out-dir", str(out_dir),
            "--job", "5", *(["--bind", bind] if bind else [])]
    with pytest.raises(SystemExit) as exit_:
        parse_arguments(argv)
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_.value.code == 2 and re.search(message, error), error
    assert not out_dir.exists()
