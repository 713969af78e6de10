"""Every rule's reach, in every engine: the traffic table (tests/traffic.py) run through each of them.

Each test is parametrized by the counter a scenario exists to reach (every name in `COUNTERS`), so a
disposition or counter added to the protocol's table without a scenario fails in every engine by its name,
and a rule one engine decides otherwise fails there by the rule's name. The golden model's outcome on the
same frames is the expectation: each frame's disposition, each frame's outputs and the counters (and, for the
scenarios with job tables, where each output goes).
"""

import pytest

from inwire import fastpath
from inwire.datagram import ip_int, ip_str
from inwire.model import Aggregator
from inwire.packets import frame_field
from inwire.protocol import COUNTERS, Disposition
from inwire.serve import SoftwareAggregator
from traffic import (
    FRAME_ONLY,
    GATEWARE_CONFIG,
    JOB_SCENARIOS,
    SCENARIOS,
    TABLE_CONFIG,
    Outcome,
    as_datagram,
    missing_scenario,
    model_outcome,
    moved_disposition,
    payloads,
)

DISPOSITIONS = [d.name.lower() for d in Disposition]
DATAGRAM_SCENARIOS = [name for name in COUNTERS if name not in FRAME_ONLY]
"""What the datagram engines (the fast path, `inwire serve`) are given: all but the frame-only scenarios."""


def scenario(name):
    if name not in SCENARIOS:
        pytest.fail(missing_scenario(name))
    return SCENARIOS[name]


def expectation(name, config):
    """The model's outcome of scenario `name` at `config`, which must reach the scenario's counter."""
    expected = model_outcome(scenario(name), config)
    assert expected.counters[name], f"{name}: the scenario leaves it 0 in the model ({expected.dispositions})"
    return expected


def differences(engine, expected, got):
    """What `got` (an Outcome) does differently from the model's `expected`, frame by frame, else []."""
    problems = []
    for index, (want, have) in enumerate(zip(expected.dispositions, got.dispositions, strict=True)):
        if want != have:
            problems.append(f"frame {index}: {engine} says {have}, the model {want}")
    for index, (want, have) in enumerate(zip(expected.outputs, got.outputs, strict=True)):
        if want != have:
            problems.append(f"frame {index}: {engine} sends {[out.hex() for out in have]}, the model "
                            f"{[out.hex() for out in want]}")
    if expected.destinations is not None:
        for index, (want, have) in enumerate(zip(expected.destinations, got.destinations or (), strict=True)):
            if want != have:
                problems.append(f"frame {index}: {engine} sends to {have}, the model to {want}")
    moved = {name: (got.counters[name], expected.counters[name]) for name in COUNTERS
             if got.counters[name] != expected.counters[name]}
    if moved:
        problems.append(f"counters ({engine}, model): {moved}")
    return problems


# --- the table -------------------------------------------------------------------------------------------

def test_the_table_has_a_scenario_for_every_disposition_and_counter():
    missing = [name for name in COUNTERS if name not in SCENARIOS]
    assert not missing, [missing_scenario(name) for name in missing]
    assert set(SCENARIOS) <= set(COUNTERS), f"scenarios for no counter: {sorted(set(SCENARIOS) - set(COUNTERS))}"
    assert set(DISPOSITIONS) <= set(SCENARIOS)
    assert set(FRAME_ONLY) <= set(SCENARIOS)
    assert set(GATEWARE_WITHOUT) <= JOB_SCENARIOS, "the gateware is given every scenario but job tables' it cannot hold"


@pytest.mark.parametrize("name", COUNTERS)
def test_datagram_engines_are_given_every_scenario_but_the_frame_only_ones(name):
    """A frame-only scenario's frames cannot arrive on a UDP socket; every other scenario's all can."""
    steps = scenario(name).steps(TABLE_CONFIG)
    datagrams = [as_datagram(data, TABLE_CONFIG) is not None for data, _ in steps]
    if name in FRAME_ONLY:
        assert not any(datagrams), f"{name} is frame-only ({FRAME_ONLY[name]}), yet a frame is a datagram"
    else:
        assert all(datagrams), f"{name}: frames {[i for i, ok in enumerate(datagrams) if not ok]} are not datagrams"


# --- the engines -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", COUNTERS)
def test_the_model(name):
    """The model is the definition: each scenario moves its counter in it, at the table's configuration and
    at a service's (another address and port), and a disposition's scenario ends with a frame of that
    disposition."""
    for config in (TABLE_CONFIG, serving_config()):
        expected = expectation(name, config)
        if name in DISPOSITIONS:
            assert expected.dispositions[-1] == name, expected.dispositions


def fast_outcome(aggregator, steps, config, jobs=False):
    """The fast path's outcome; with job tables (`jobs`) it is given each datagram's (host, port) and answers
    with the list of (payload, (host, port)) the tables send to."""
    dispositions, outputs, destinations = [], [], []
    for data, now in steps:
        payload, source, port = as_datagram(data, config)
        if not jobs:
            disposition, answer = aggregator.handle(payload, now, source)
            outputs.append(() if answer is None else (bytes(answer),))
        else:
            disposition, answers = aggregator.handle(payload, now, (ip_str(source), port))
            outputs.append(tuple(bytes(body) for body, _ in answers or ()))
            destinations.append(tuple((ip_int(host), port) for _, (host, port) in answers or ()))
        dispositions.append(Disposition(disposition).name.lower())
    return Outcome(tuple(dispositions), tuple(outputs), aggregator.stats(), tuple(destinations) if jobs else None)


def jobs_of(name, config):
    """Scenario `name`'s job tables, for `config`'s addresses."""
    return scenario(name).jobs(config) if scenario(name).jobs else []


def installed(engine, install, name, config):
    """Install scenario `name`'s job tables (for `config`'s addresses) with the engine's method `install`."""
    for entry in jobs_of(name, config):
        getattr(engine, install)(entry)


@pytest.mark.parametrize("name", DATAGRAM_SCENARIOS)
def test_the_fast_path(name):
    if fastpath.compiled is None:
        pytest.fail("the compiled fast path is not built (run `make setup`)")
    expected = expectation(name, TABLE_CONFIG)
    fast = fastpath.FastAggregator(scenario(name).configured(TABLE_CONFIG))
    installed(fast, "install", name, TABLE_CONFIG)
    got = fast_outcome(fast, scenario(name).steps(TABLE_CONFIG), TABLE_CONFIG, jobs=name in JOB_SCENARIOS)
    problems = differences("fast path", expected, got)
    assert not problems, "; ".join(problems)


SERVE_ENGINES = ["golden", "fast"]


def serving(engine, registered=False):
    """A service at the table's sizes; `registered`: with job tables (and a control port keyed with zeros,
    never the user's key; the tables are installed directly)."""
    tables = dict(registered=True, key=bytes(32)) if registered else {}
    return SoftwareAggregator(("127.0.0.1", 0), slots=TABLE_CONFIG.slots, max_elements=TABLE_CONFIG.max_elements,
                              lease=TABLE_CONFIG.lease, log=lambda line: None, engine=engine, receive_buffer=None,
                              **tables)


def serving_config():
    server = serving("golden")
    server.close()
    return server.config


def serve_outcome(server, steps, jobs=False):
    dispositions, outputs, destinations = [], [], []
    for data, now in steps:
        payload, source, port = as_datagram(data, server.config)
        before = server.counters()
        sends = server.handle(payload, (ip_str(source), port), now)
        dispositions.append(moved_disposition(before, server.counters()))
        outputs.append(tuple(bytes(body) for body, _ in sends))
        destinations.append(tuple((ip_int(host), port) for _, (host, port) in sends))
    counters = server.counters()
    return Outcome(tuple(dispositions), tuple(outputs), {name: counters[name] for name in COUNTERS},
                   tuple(destinations) if jobs else None)


@pytest.mark.parametrize("engine", SERVE_ENGINES)
@pytest.mark.parametrize("name", DATAGRAM_SCENARIOS)
def test_serve(name, engine):
    """`inwire serve`'s whole decision (`handle`: its own refusals, then the engine's), at its address."""
    if engine == "fast-c" and fastpath.compiled is None:
        pytest.fail("the compiled fast path is not built (run `make setup`)")
    jobs = name in JOB_SCENARIOS
    server = serving(engine, registered=jobs)
    try:
        expected = expectation(name, server.config)
        installed(server, "install_job", name, server.config)
        got = serve_outcome(server, scenario(name).steps(server.config), jobs)
    finally:
        server.close()
    problems = differences(f"serve ({engine})", expected, got)
    assert not problems, "; ".join(problems)


# --- the gateware ------------------------------------------------------------------------------------------

GATEWARE_SIMULATOR = "verilator"
"""One simulator, one cocotb run per width: the builds are the cocotb suite's (`GATEWARE_CONFIG`), so the
table adds only its run."""
GATEWARE_WITHOUT = {"relayed": "its job has a clique routed to a parent: the gateware's tables hold no routes"}
"""Scenarios the gateware is not given, and why."""
GATEWARE_SCENARIOS = [name for name in COUNTERS if name not in GATEWARE_WITHOUT]


def gateware_outcomes(width):
    """{scenario name: (Outcome, aborted answers per frame)} of the gateware at `width`, every scenario of
    the table in one cocotb run."""
    import json
    import shutil
    import tempfile
    from pathlib import Path

    from inwire_hdl import sim

    if shutil.which(GATEWARE_SIMULATOR) is None:
        pytest.fail(f"{GATEWARE_SIMULATOR} is not on PATH (run `make setup`)")
    runner, run_dir = sim.build(GATEWARE_SIMULATOR, width, GATEWARE_CONFIG)
    steps = {name: {"jobs": [job_json(entry) for entry in jobs_of(name, GATEWARE_CONFIG)],
                    "steps": [(data.hex(), now) for data, now in SCENARIOS[name].steps(GATEWARE_CONFIG)]}
             for name in GATEWARE_SCENARIOS}
    with tempfile.TemporaryDirectory() as scratch:
        inputs, outputs = Path(scratch) / "in.json", Path(scratch) / "out.json"
        inputs.write_text(json.dumps(steps))
        outcome = sim.run(runner, run_dir, GATEWARE_CONFIG, testcase="traffic_table", test_module="traffic_table",
                          extra_env={"INWIRE_TABLE_IN": str(inputs), "INWIRE_TABLE_OUT": str(outputs)},
                          results_name="traffic_table.xml")
        assert outcome == {"traffic_table": True} and outputs.exists(), (
            f"the traffic table's simulation failed: {outcome}, see {run_dir / 'traffic_table.log'}")
        results = json.loads(outputs.read_text())
    outcomes = {}
    for name, frames in results.items():
        dispositions, previous = [], dict.fromkeys(COUNTERS, 0)
        for entry in frames:
            dispositions.append(moved_disposition(previous, entry["counters"]))
            previous = entry["counters"]
        sent = [[bytes.fromhex(out) for out in entry["outputs"]] for entry in frames]
        destinations = tuple(tuple((frame_field(out, "ip_dst"), frame_field(out, "udp_dport")) for out in outs)
                             for outs in sent)
        outcomes[name] = (Outcome(tuple(dispositions), tuple(payloads(outs) for outs in sent), previous,
                                  destinations if name in JOB_SCENARIOS else None),
                          [entry["aborted"] for entry in frames])
    return outcomes


def job_json(entry):
    """A job entry as the cocotb driver reads it (tb/aggregator/traffic_table.py)."""
    return {"job": entry.job, "token": entry.token, "slots": entry.slots, "members": sorted(entry.members),
            "group": entry.group}


@pytest.fixture(scope="module", params=[8, 64], ids=lambda width: f"w{width}")
def gateware(request):
    return request.param, gateware_outcomes(request.param)


def expected_aborts(name, width):
    """Answers the model says a cut-through aggregator at `width` starts and aborts, per frame."""
    model = Aggregator(scenario(name).configured(GATEWARE_CONFIG))
    installed(model, "install", name, GATEWARE_CONFIG)
    aborts = []
    for data, now in scenario(name).steps(GATEWARE_CONFIG):
        aborts.append(int(model.cut_through_abort(data, width, now) is not None))
        model.process(data, now)
    return aborts


@pytest.mark.sim
@pytest.mark.parametrize("name", GATEWARE_SCENARIOS)
def test_the_gateware(gateware, name):
    width, outcomes = gateware
    expected = expectation(name, GATEWARE_CONFIG)
    got, aborted = outcomes[name]
    problems = differences(f"gateware ({GATEWARE_SIMULATOR}, width {width})", expected, got)
    assert not problems, "; ".join(problems)
    assert aborted == expected_aborts(name, width)
