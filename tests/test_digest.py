"""A clique agrees on what it averages before its first sum: islands whose models (or schedules) differ are
told so, every one of them, in one line, with no parameter averaged (issue #39: an island that registered a
submodule in another order was averaged element by element with the others, silently)."""

import contextlib
import re
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from inwire.client import (  # noqa: E402
    DEFAULT_WINDOW,
    CliqueKey,
    agreement_key,
    agreement_round,
    averaging_round,
    job_slots,
    slot,
)
from inwire.codec_average import ATTEMPTS, AVERAGING_ATTEMPTS, clique_average  # noqa: E402
from inwire.control import JobLease, new_job  # noqa: E402
from inwire.serve import SoftwareAggregator, serving_in_thread  # noqa: E402
from inwire.train.averaging import MAX_ROUNDS, InwireExchange, LayoutMismatch  # noqa: E402
from islands import average_in_threads  # noqa: E402

DIGESTS = "\0"
"""Where a message shows two layout digests ("x against y", each 8 hex digits; `assert_refused_everywhere`)."""
TAIL = ("; every island must build the same model (its submodules registered in the same order) and load the same "
        "schedule; nothing was averaged")


class Pair(torch.nn.Module):
    """Two submodules, `first` and `second`, registered in the order `order` names them."""

    def __init__(self, first, second, order="first, second"):
        super().__init__()
        for name in order.split(", "):
            setattr(self, name, {"first": first, "second": second}[name])


def pair(order="first, second", seed=0):
    torch.manual_seed(seed)
    return Pair(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2), order)


def twins(order="first, second", seed=0):
    """Two submodules of one shape: another order changes only which parameter sits where."""
    torch.manual_seed(seed)
    return Pair(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3), order)


@contextlib.contextmanager
def registered(names, max_cliques=1):
    """{island: exchange}, every island a member of one registered job at a loopback `inwire serve`."""
    with serving_in_thread(SoftwareAggregator(("127.0.0.1", 0), unicast=True, registered=True,
                                              log=lambda line: None)) as server:
        exchanges = {name: InwireExchange(server.address, deadline_s=10) for name in names}
        try:
            entry = new_job([exchange.address for exchange in exchanges.values()],
                            job_slots(max_cliques, DEFAULT_WINDOW, len(names)))
            for exchange in exchanges.values():
                exchange.join(entry)
            with JobLease(server.address, entry):
                yield server, exchanges
        finally:
            for exchange in exchanges.values():
                exchange.close()


def average_once(models, named=False, schedules=None, steps=1):
    """Every island averages `steps` times through a registered job; {island: its error or None}."""
    names = list(models)
    with registered(names) as (_, exchanges):
        return average_in_threads(models, exchanges, {name: (schedules or {}).get(name, [[(tuple(names), "LON")]])
                                                      for name in names}, steps, named=names if named else ())


def values(model):
    return [p.detach().clone() for p in model.parameters()]


def assert_refused_everywhere(models, expected, **options):
    """Every island raises `expected` as a LayoutMismatch (two different digests at DIGESTS), one message on
    every island, its parameters as they were."""
    before = {name: values(model) for name, model in models.items()}
    outcome = average_once(models, **options)
    pattern = re.escape(expected).replace(re.escape(DIGESTS), "([0-9a-f]{8}) against ([0-9a-f]{8})")
    for name, error in outcome.items():
        assert isinstance(error, LayoutMismatch), (name, error)
        shown = re.fullmatch(pattern, str(error))
        assert shown and shown[1] != shown[2], (name, str(error))
    assert len({str(error) for error in outcome.values()}) == 1, "one message on every island"
    for name in models:
        assert all(torch.equal(p, q) for p, q in zip(values(models[name]), before[name], strict=True)), name


@pytest.mark.parametrize("islands", ["AB", "ABC"])
def test_a_submodule_registered_in_another_order_is_named_on_every_island(islands):
    """The issue's case: the same parameters, the same count, one island's submodules in the other order."""
    models = {name: pair() for name in islands[:-1]}
    models[islands[-1]] = pair("second, first")
    others = ", ".join(islands[:-1])
    assert_refused_everywhere(models, f"round 0, clique 0 ({', '.join(islands)}): island {islands[-1]} averages the "
                                      f"same parameter shapes in another order, compared with {others} (layout "
                                      f"digest {DIGESTS}){TAIL}")


def test_twins_in_another_order_are_told_apart_by_their_names():
    """Two submodules of one shape swapped: the shapes agree, the names (`named_parameters()`) do not."""
    models = {"A": twins(), "B": twins(), "C": twins("second, first")}
    assert_refused_everywhere(models, "round 0, clique 0 (A, B, C): island C averages parameters of other names or "
                                      f"in another order, compared with A, B (layout digest "
                                      f"{DIGESTS}){TAIL}", named=True)


def test_another_dtype_is_caught():
    models = {"A": pair(), "B": pair(), "C": pair().double()}
    assert_refused_everywhere(models, "round 0, clique 0 (A, B, C): island C averages parameters of other dtypes, "
                                      f"compared with A, B (layout digest {DIGESTS}){TAIL}")


def test_another_shape_of_the_same_element_count_is_caught():
    """12 weights as (2, 6) on A and B, as (3, 4) on C: one vector length, other parameters."""
    torch.manual_seed(0)
    models = {"A": torch.nn.Linear(6, 2, bias=False), "B": torch.nn.Linear(6, 2, bias=False),
              "C": torch.nn.Linear(4, 3, bias=False)}
    assert_refused_everywhere(models, "round 0, clique 0 (A, B, C): island C averages parameters of other shapes, "
                                      f"compared with A, B (layout digest {DIGESTS}){TAIL}")


def test_two_islands_apart_from_the_rest_are_named_together():
    models = {"A": pair(), "B": pair("second, first"), "C": pair(), "D": pair("second, first"), "E": pair()}
    assert_refused_everywhere(models, "round 0, clique 0 (A, B, C, D, E): islands B, D average the same parameter "
                                      "shapes in another order, compared with A, C, E (layout digest "
                                      f"{DIGESTS}){TAIL}")


def test_another_schedule_is_caught():
    """C sees the clique at another aggregator city: its rounds are not the others'."""
    models = {name: pair() for name in "ABC"}
    schedules = {"C": [[(("A", "B", "C"), "FRA")]]}
    assert_refused_everywhere(models, "round 0, clique 0 (A, B, C): island C averages along another schedule "
                                      "(rounds, cliques, aggregators), compared with A, B (layout digest "
                                      f"{DIGESTS}){TAIL}",
                              schedules=schedules)


def test_agreeing_islands_average_exactly_and_agree_once_per_clique():
    """Named parameters on A and B, plain ones on C (names then count for nobody): the exact clique average
    every time, and one agreement sum (of one chunk) for all three averagings."""
    models = {name: pair(seed=seed) for seed, name in enumerate("ABC")}
    flat = {name: torch.nn.utils.parameters_to_vector(model.parameters()).detach().numpy().copy()
            for name, model in models.items()}
    names = list(models)
    expected = clique_average([flat[name] for name in names])
    for _ in range(2):
        expected = clique_average([expected] * 3)
    with registered(names) as (server, exchanges):
        outcome = average_in_threads(models, exchanges, {name: [[(tuple(names), "LON")]] for name in names}, 3,
                                     named="AB")
        counters = server.counters()
    errors = [error for error in outcome.values() if error is not None]
    assert not errors, errors
    for name in names:
        assert np.array_equal(torch.nn.utils.parameters_to_vector(models[name].parameters()).detach().numpy(),
                              expected), name
    assert counters["accumulated"] == 3 * (3 + 1), "three averagings of one chunk each, one agreement"


@pytest.mark.parametrize("round_index", [0, 1, 2, 17, MAX_ROUNDS])
def test_the_agreement_takes_a_protocol_round_and_slots_no_averaging_near_it_takes(round_index):
    """Round r's agreement is the protocol round just before its first sum: never an attempt of round r - 1 or r
    (each averages in AVERAGING_ATTEMPTS), and named as round r's in messages. Its chunk j takes the slot of
    round r's chunk j + W, sent only once chunk j's result is in, and none of round r - 1's first sums, which
    other cliques may still be summing."""
    agreement = agreement_round(round_index)
    attempts = {(other * ATTEMPTS + attempt) % 2**32 for other in (round_index - 1, round_index) if other >= 0
                for attempt in range(AVERAGING_ATTEMPTS)}
    assert agreement not in attempts and 0 <= agreement < 2**32
    assert averaging_round(agreement) == round_index
    assert {averaging_round(protocol) for protocol in attempts if protocol >= round_index * ATTEMPTS} == {round_index}
    cliques, window = 3, DEFAULT_WINDOW
    key = CliqueKey(1, round_index, 1, 0, 2, 0, cliques)
    agreement_slots = [agreement_key(key).slot(chunk, window) for chunk in range(window)]
    first_sum = [replace(key, round=round_index * ATTEMPTS).slot(chunk + window, window) for chunk in range(window)]
    assert agreement_slots == first_sum
    before = {slot((round_index - 1) * ATTEMPTS % 2**32, clique, chunk, window, cliques)
              for clique in range(cliques) for chunk in range(4 * window)}
    assert not before & set(agreement_slots)


def test_an_island_on_at_the_next_round_s_agreement_leaves_this_round_s_sums_alone():
    """D has no clique in round 0 and goes straight on to round 1's agreement, with A, while A, B and C have yet
    to sum round 0: their sums take no slot D's agreement holds (none of their contributions is stale), and
    every averaging ends."""
    models = {name: pair(seed=seed) for seed, name in enumerate("ABCD")}
    schedule = [[(("A", "B", "C"), "LON"), (("D",), None)], [(("A", "D"), "FRA"), (("B", "C"), "AMS")]]
    with registered(list(models), max_cliques=2) as (server, exchanges):
        outcome = average_in_threads(models, exchanges, dict.fromkeys(models, schedule), 2, first="D",
                                     ready=lambda: server.counters()["accumulated"] >= 1)
        counters = server.counters()
    errors = [error for error in outcome.values() if error is not None]
    assert not errors, errors
    assert counters["drop_stale"] == 0, counters
