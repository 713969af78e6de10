"""Model averaging through the software aggregator over UDP: exact clique averages, refusals."""

import copy
import io
import math
import socket
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from inwire.client import ClientError  # noqa: E402
from inwire.codec import choose_exponent, dequantize, quantize  # noqa: E402
from inwire.codec_average import AveragingError, clique_average  # noqa: E402
from inwire.serve import SoftwareAggregator, serving_in_thread  # noqa: E402
from inwire.train.averaging import CliqueAverager, InwireExchange, LocalSGD, OuterOptimizer, anchor_parameters  # noqa: E402

ROUNDS = [[(("A", "B", "C"), "LON"), (("D",), None)], [(("A", "D"), "FRA"), (("B", "C"), "AMS")]]


@pytest.fixture
def aggregator():
    with serving_in_thread(SoftwareAggregator(("127.0.0.1", 0), unicast=True, slots=64, max_elements=64,
                                              log=lambda line: None)) as server:
        yield server


def run_islands(aggregator, models, steps, period=1, bound=16.0, chunk=64, outer=None):
    """Each island in its own thread: `steps` optimizer-free steps, averaging every `period`."""
    errors = []

    def island(name, model):
        exchange = InwireExchange(aggregator.address, bound=bound, chunk=chunk, deadline_s=10)
        averager = CliqueAverager(period, island=name, rounds=ROUNDS, exchange=exchange, outer=outer)
        try:
            for _ in range(steps):
                averager.average_parameters(model.parameters())
        except Exception as error:  # the test reports it below
            errors.append(error)
        finally:
            exchange.close()

    run_in_threads(island, models.items(), errors)
    return models


def run_in_threads(target, arguments, errors):
    """`target(*args)` for each of `arguments`, each in its own thread, all at once; what they put in
    `errors` fails the test."""
    threads = [threading.Thread(target=target, args=tuple(args)) for args in arguments]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors


def models_for(names, size=150, seed=0, scale=1.0):
    generator = torch.Generator().manual_seed(seed)
    models = {}
    for name in names:
        model = torch.nn.Linear(size, 1, bias=False)
        with torch.no_grad():
            model.weight.copy_(torch.randn(model.weight.shape, generator=generator) * scale)
        models[name] = model
    return models


def expected_average(vectors, bound=16.0):
    exponent = choose_exponent(bound, len(vectors))
    total = np.sum([quantize(v, exponent).astype(np.int64) for v in vectors], axis=0)
    return dequantize(total, exponent, len(vectors))


def flat(model):
    return model.weight.detach().numpy().ravel().copy()


def test_clique_reaches_the_exact_quantized_average(aggregator):
    models = models_for("ABCD")
    before = {name: flat(model) for name, model in models.items()}
    run_islands(aggregator, models, steps=1)
    clique = expected_average([before[name] for name in "ABC"])
    for name in "ABC":
        assert np.array_equal(flat(models[name]), clique), name
    assert np.array_equal(flat(models["D"]), before["D"]), "a singleton keeps its parameters"
    assert np.array_equal(clique_average([before[name] for name in "ABC"]), clique), "the study's arithmetic"


def test_two_rounds_follow_the_rotation(aggregator):
    models = models_for("ABCD", seed=3)
    before = {name: flat(model) for name, model in models.items()}
    run_islands(aggregator, models, steps=4, period=2)
    first = expected_average([before[name] for name in "ABC"])
    after_first = {"A": first, "B": first, "C": first, "D": before["D"]}
    assert np.array_equal(flat(models["A"]), expected_average([after_first["A"], after_first["D"]]))
    assert np.array_equal(flat(models["B"]), expected_average([after_first["B"], after_first["C"]]))


def resent_average(values, bound):
    """What members get when they start at `bound` and double it until the sum stops saturating."""
    while True:
        exponent = choose_exponent(bound, len(values))
        total = np.sum([quantize(v, exponent).astype(np.int64) for v in values], axis=0)
        if np.abs(total).max() <= 2**31 - 1:
            return bound, dequantize(total, exponent, len(values))
        bound *= 2


def test_saturated_sum_is_resent_at_twice_the_bound(aggregator):
    models = models_for("ABCD", seed=5)
    with torch.no_grad():
        for name in "ABC":
            models[name].weight[0, 7] = 10.0
    before = {name: flat(model) for name, model in models.items()}
    run_islands(aggregator, models, steps=1, bound=4.0)
    bound, average = resent_average([before[name] for name in "ABC"], 4.0)
    assert bound == 8.0, "three values of 10 overflow a sum bounded for 4, not for 8"
    assert np.array_equal(flat(models["A"]), average)
    assert aggregator.counters()["saturations"] > 0
    # The study's in-process clique_average agrees bit for bit with the UDP path, resend included.
    assert np.array_equal(clique_average([before[name] for name in "ABC"], 4.0), flat(models["B"]))


def test_values_beyond_int32_raise_the_bound_for_everyone(aggregator):
    models = models_for("ABCD", seed=6)
    with torch.no_grad():
        models["B"].weight[0, 3] = 1000.0
    before = {name: flat(model) for name, model in models.items()}
    run_islands(aggregator, models, steps=1, bound=4.0)
    values = [before[name] for name in "ABC"]
    limit = math.ldexp(2**31 - 1, choose_exponent(4.0, 3))
    doublings = math.ceil(math.log2(1000.0 / limit))
    _, average = resent_average(values, 4.0 * 2**doublings)
    assert np.array_equal(flat(models["C"]), average)
    assert np.array_equal(clique_average(values, 4.0), average)


def test_outer_step_moves_from_the_anchor_along_the_averaged_delta(aggregator):
    """Outer Nesterov: the anchor is the parameters at the first call; parameters end at its outer step."""
    outer = OuterOptimizer(lr=0.7, momentum=0.9)
    models = models_for("ABCD", seed=9)
    before = {name: flat(model) for name, model in models.items()}
    run_islands(aggregator, models, steps=1, outer=outer)
    average = clique_average([before[name] for name in "ABC"])
    for name in "ABC":
        gradient = before[name] - average
        expected = before[name] - np.float32(0.7) * (gradient + np.float32(0.9) * gradient)
        np.testing.assert_allclose(flat(models[name]), expected, rtol=0, atol=1e-6)
        assert not np.array_equal(flat(models[name]), average)


@pytest.mark.parametrize("outer", [OuterOptimizer(0.7, 0.9), OuterOptimizer(0.7, 0.9, nesterov=False),
                                   OuterOptimizer(1.3, 0.0), OuterOptimizer()], ids=repr)
def test_the_outer_step_in_place_is_the_outer_step_bit_for_bit(outer):
    """Three steps of `step_in_place` (into the anchor and the momentum buffer, block by block, across a
    block's edge) end at the very bits `step`'s do, from no buffer on."""
    from inwire.train.outer import STEP_BLOCK

    rng = np.random.default_rng(3)
    anchor = rng.standard_normal(STEP_BLOCK + 7).astype(np.float32)
    in_place, buffer, in_place_buffer = anchor.copy(), None, None
    for _ in range(3):
        average = (anchor + rng.standard_normal(len(anchor)).astype(np.float32) / 3).astype(np.float32)
        anchor, buffer = outer.step(anchor, buffer, average)
        in_place_buffer = outer.step_in_place(in_place, in_place_buffer, average)
        assert np.array_equal(in_place, anchor)
        assert (buffer is None and in_place_buffer is None) or np.array_equal(in_place_buffer, buffer)


def test_an_outer_step_at_lr_1_with_momentum_is_no_plain_average():
    """Learning rate 1 is plain averaging only without momentum: with momentum 0.5 the first outer step goes
    (1 + 0.5) times the outer gradient from the anchor (Nesterov), past the clique's average (2 everywhere)."""
    model = torch.nn.Linear(3, 1)
    anchor = torch.nn.utils.parameters_to_vector(model.parameters()).detach().numpy().copy()
    averager = CliqueAverager(1, island="A", rounds=ROUNDS, exchange=Echo(), outer=OuterOptimizer(1.0, 0.5))
    averager.average_parameters(model.parameters())
    gradient = anchor - np.float32(2.0)
    expected = anchor - np.float32(1.5) * gradient
    after = torch.nn.utils.parameters_to_vector(model.parameters()).detach().numpy()
    np.testing.assert_allclose(after, expected, rtol=0, atol=1e-6)
    assert not np.allclose(after, 2.0)


def test_parameter_groups_are_accepted_like_torch_averagers():
    model = torch.nn.Linear(3, 1)
    averager = CliqueAverager(1, island="A", rounds=ROUNDS, exchange=Echo())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert averager.average_parameters(optimizer.param_groups) == ["A", "B", "C"]
    assert torch.equal(model.weight, torch.full((1, 3), 2.0))


def test_averager_refuses_a_schedule_without_its_island():
    with pytest.raises(ValueError, match="does not name island 'Z'"):
        CliqueAverager(1, island="Z", rounds=ROUNDS)


def test_unanswered_round_fails_with_a_clear_error():
    silent = InwireExchange(("127.0.0.1", 9), timeout_s=0.05, deadline_s=0.3, retries=3)
    try:
        with pytest.raises(ClientError, match="no result for chunk 0 of 1 from the aggregator at 127.0.0.1:9 after 3 "
                                              "retransmissions .* a member of the clique never contributed"):
            silent.average(0, 0, ["A", "B"], 0, np.zeros(10, dtype=np.float32))
    finally:
        silent.close()



def test_an_unanswered_averaging_names_its_round_and_the_aggregator_it_sent_to():
    """The 18th averaging (round 17, as the averager counts them; the first of this run, so its clique first
    agrees on what it averages, at protocol round 118) sent to a socket that never answers: the error names that
    round and the address the island sent to, and leaves out the roll call's slot count, which a default
    service holds."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
        silent.bind(("127.0.0.1", 0))
        port = silent.getsockname()[1]
        exchange = InwireExchange(("127.0.0.1", port), timeout_s=0.05, deadline_s=1.0)
        try:
            averager = CliqueAverager(1, island="A", rounds=ROUNDS, exchange=exchange)
            model = torch.nn.Linear(3, 1)
            averager.load_state_dict({"step": 17, "rounds_done": 17, "anchor": torch.zeros(4), "buffer": None})
            with pytest.raises(ClientError) as raised:
                averager.average_parameters(model.parameters())
        finally:
            exchange.close()
    message = str(raised.value)
    assert message.startswith(f"round 17 (agreement on what is averaged), clique 0 (A, D): no result for chunk 0 "
                              f"of 1 from the aggregator at 127.0.0.1:{port} after "), message
    assert "the aggregator answered neither the sum nor any of" in message and "slots" not in message, message


def small_model():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))


@pytest.mark.parametrize("given", ["parameters", "param_groups"])
def test_an_outer_optimizer_on_the_model_parameters_is_refused_before_any_step(given):
    """torchft's DiLoCo takes its outer optimizer on the model's parameters; here that optimizer would step
    the local parameters instead of the anchor, and islands would train on without ever agreeing. Trained
    that way, the first call refuses in one line naming the fix, and changes nothing."""
    model = small_model()
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    averager = CliqueAverager(1, island="A", rounds=ROUNDS, exchange=Echo(), outer_optimizer=outer)
    inner.zero_grad()
    model(torch.ones(5, 3)).square().sum().backward()
    inner.step()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match=r"^outer_optimizer holds the model's own parameters; build it on "
                                         r"anchor_parameters\(model\)"):
        averager.average_parameters(model.parameters() if given == "parameters" else inner.param_groups)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))
    assert averager.step == 0 and averager.anchor is None


def test_an_outer_optimizer_on_the_anchor_parameters_is_taken():
    model = small_model()
    outer = torch.optim.SGD(anchor_parameters(model), lr=0.7, momentum=0.9, nesterov=True)
    averager = CliqueAverager(1, island="A", rounds=ROUNDS, exchange=Echo(), outer_optimizer=outer)
    assert averager.average_parameters(model.parameters()) == ["A", "B", "C"]


@pytest.mark.parametrize("named", [True, False])
def test_a_non_finite_parameter_is_named_with_the_step(named):
    """An island whose training diverged: the averaging refuses naming the parameter (by name when given
    named_parameters(), else by index and shape) and the step, before anything is sent."""
    model = small_model()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
        silent.bind(("127.0.0.1", 0))
        exchange = InwireExchange(silent.getsockname(), timeout_s=0.05, deadline_s=5)
        try:
            averager = CliqueAverager(3, island="A", rounds=ROUNDS, exchange=exchange)
            for _ in range(2):
                averager.average_parameters(model.named_parameters() if named else model.parameters())
            with torch.no_grad():
                model[2].weight[1, 0] = float("nan")
                model[2].weight[0, 3] = float("inf")
            with pytest.raises(AveragingError) as raised:
                averager.average_parameters(model.named_parameters() if named else model.parameters())
            which = "'2.weight'" if named else "2 of 4"
            assert str(raised.value) == (f"step 3: parameter {which} (shape (2, 4)) holds 1 NaN and 1 infinite values "
                                         f"at averaging round 0; the island's training diverged since its last "
                                         f"averaging (a lower learning rate or gradient clipping may help)")
            silent.settimeout(0)
            with pytest.raises(BlockingIOError):
                silent.recv(2048)
        finally:
            exchange.close()

@pytest.mark.sim
def test_averaging_through_the_gateware_matches_the_model():
    """`inwire serve --sim`: the same UDP service, answered by the co-simulated gateware."""
    from inwire_hdl.cosim import CoSimulation

    gateware = SoftwareAggregator(("127.0.0.1", 0), unicast=True, slots=64, max_elements=64, log=lambda line: None,
                                  make_aggregator=lambda config: CoSimulation("verilator", 64, config))
    with serving_in_thread(gateware) as server:
        models = models_for("ABCD", seed=8)
        before = {name: flat(model) for name, model in models.items()}
        run_islands(server, models, steps=1)
        counters = server.counters()
    clique = expected_average([before[name] for name in "ABC"])
    for name in "ABC":
        assert np.array_equal(flat(models[name]), clique), name
    # The clique's chunks, and the one of its agreement on what it averages (3 x 11 layout words).
    assert counters["accumulated"] == 3 * (-(-151 // 64) + 1)


class Alone:
    """An exchange without a network whose clique's members all hold this island's layout words."""

    def gather(self, round_index, clique_index, members, me, words, **route):
        return np.tile(words, (len(members), 1))


class Echo(Alone):
    """An exchange whose clique average is every parameter at 2 (no network)."""

    def average(self, round_index, clique_index, members, me, vector, **route):
        return np.full_like(vector, 2.0)


def resumable(model, **options):
    """A's averager with a torch outer optimizer on `model`, as a job builds it before it loads a checkpoint."""
    outer = torch.optim.SGD(anchor_parameters(model), lr=0.7, momentum=0.9, nesterov=True)
    return CliqueAverager(1, island="A", rounds=ROUNDS, exchange=Echo(), outer_optimizer=outer, **options)


def saved_state():
    """state_dict() after two averagings: 2 steps, 2 rounds, an anchor of 4 values, momentum in the optimizer."""
    model = torch.nn.Linear(3, 1)
    averager = resumable(model)
    for _ in range(2):
        averager.average_parameters(model.parameters())
    return averager.state_dict()


def tampered(change):
    state = saved_state()
    change(state)
    return state


def replace(field, value):
    return lambda state: state.__setitem__(field, value(state[field]) if callable(value) else value)


TAMPERED = {
    "step NaN": (replace("step", math.nan), "checkpoint field 'step': nan is not a whole number"),
    "step negative": (replace("step", -1), "checkpoint field 'step': -1 is negative"),
    "step a float": (replace("step", 2.0), "checkpoint field 'step': 2.0 is not a whole number"),
    "rounds_done negative": (replace("rounds_done", -3), "checkpoint field 'rounds_done': -3 is negative"),
    "rounds_done beyond the steps": (replace("rounds_done", 5), "checkpoint field 'rounds_done': 5 averagings in 2 "
                                                                "steps"),
    "rounds_done huge": (lambda state: state.update(step=2**40, rounds_done=2**40),
                         "checkpoint field 'rounds_done': 1099511627776 is past the last round the protocol numbers"),
    "anchor all NaN": (replace("anchor", lambda anchor: torch.full_like(anchor, math.nan)),
                       "checkpoint field 'anchor': 4 NaN values"),
    "anchor infinite": (replace("anchor", lambda anchor: torch.cat([anchor[:3], torch.tensor([math.inf])])),
                        "checkpoint field 'anchor': 1 infinite values"),
    "anchor a list": (replace("anchor", lambda anchor: anchor.tolist()), "checkpoint field 'anchor': a list, not a "
                                                                         "tensor"),
    "anchor int64": (replace("anchor", lambda anchor: anchor.to(torch.int64)),
                     "checkpoint field 'anchor': int64, not float32"),
    "anchor of another shape": (replace("anchor", lambda anchor: anchor.reshape(2, 2)),
                                r"checkpoint field 'anchor': shape \(2, 2\), not one vector"),
    "anchor longer": (replace("anchor", lambda anchor: torch.cat([anchor, anchor])),
                      "checkpoint field 'anchor': 8 values, the outer optimizer holds 4 parameters"),
    "anchor None after steps": (replace("anchor", None), "checkpoint field 'anchor': None after 2 steps"),
    "buffer of the wrong length": (replace("buffer", torch.zeros(3)), "checkpoint field 'buffer': 3 values, the "
                                                                      "anchor 4"),
    "buffer NaN": (replace("buffer", torch.full((4,), math.nan)), "checkpoint field 'buffer': 4 NaN values"),
    "step missing": (lambda state: state.pop("step"), "checkpoint field 'step': missing"),
    "outer_optimizer missing": (lambda state: state.pop("outer_optimizer"),
                                "checkpoint field 'outer_optimizer': missing"),
    "outer_optimizer of other groups": (replace("outer_optimizer", lambda outer: {**outer, "param_groups": []}),
                                        "checkpoint field 'outer_optimizer': .*parameter groups"),
    "a field unknown": (replace("steps", 2), "checkpoint field 'steps': not a field of this averager's state"),
}


@pytest.mark.parametrize("change, message", TAMPERED.values(), ids=TAMPERED.keys())
def test_a_tampered_checkpoint_is_refused_naming_its_field_before_anything_changes(change, message):
    model = torch.nn.Linear(3, 1)
    averager = resumable(model)
    anchors = averager.outer_optimizer.param_groups[0]["params"]
    before = [p.detach().clone() for p in [*model.parameters(), *anchors]]
    with pytest.raises(ValueError, match=message):
        averager.load_state_dict(tampered(change))
    assert all(torch.equal(p, q) for p, q in zip([*model.parameters(), *anchors], before, strict=True))
    assert (averager.step, averager.rounds_done, averager.anchor, averager.buffer) == (0, 0, None, None)
    assert not averager.outer_optimizer.state, "the optimizer's momentum stays as it was (none)"


def test_an_untampered_checkpoint_still_loads():
    model = torch.nn.Linear(3, 1)
    averager = resumable(model)
    averager.load_state_dict(saved_state())
    assert (averager.step, averager.rounds_done, len(averager.anchor)) == (2, 2, 4)


def test_a_checkpoint_of_an_outer_optimizer_is_refused_by_an_averager_without_one():
    averager = CliqueAverager(1, island="A", rounds=ROUNDS, exchange=Echo())
    with pytest.raises(ValueError, match="checkpoint field 'outer_optimizer': not a field of this averager's state "
                                         r"\(saved with an outer_optimizer this averager does not have\)"):
        averager.load_state_dict(saved_state())


def test_an_anchor_of_another_model_is_refused_at_the_first_averaging_without_a_step():
    """Without an outer optimizer the averager meets the model's size at its first call, before it steps."""
    state = {**saved_state(), "anchor": torch.zeros(9)}
    del state["outer_optimizer"]
    model = torch.nn.Linear(3, 1)
    averager = CliqueAverager(1, island="A", rounds=ROUNDS, exchange=Echo(), outer=OuterOptimizer(0.7, 0.9))
    averager.load_state_dict(state)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match="checkpoint field 'anchor': 9 values, the model has 4 parameters"):
        averager.average_parameters(model.parameters())
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))
    assert averager.step == 2


def test_islands_resumed_from_checkpoints_of_different_rounds_are_told_so(aggregator):
    """A resumes after 2 averagings, B after 1: each one's roll call finds the other's record a round away,
    and both errors say so instead of naming the other as missing."""
    pair = [[(("A", "B"), "LON")]]
    states = {}
    for name, steps in (("A", 2), ("B", 1)):
        model = torch.nn.Linear(3, 1)
        averager = CliqueAverager(1, island=name, rounds=pair, exchange=Echo())
        for _ in range(steps):
            averager.average_parameters(model.parameters())
        states[name] = averager.state_dict()
    errors = {}

    def island(name):
        exchange = InwireExchange(aggregator.address, timeout_s=0.05, deadline_s=3)
        try:
            averager = CliqueAverager(1, island=name, rounds=pair, exchange=exchange)
            averager.load_state_dict(states[name])
            averager.average_parameters(torch.nn.Linear(3, 1).parameters())
        except ClientError as error:
            errors[name] = str(error)
        finally:
            exchange.close()

    threads = [threading.Thread(target=island, args=(name,)) for name in "AB"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(errors) == ["A", "B"], errors
    assert "no contribution of B arrived: B at round 1 answered the roll call, this island at round 2 " \
        "(checkpoints of different rounds" in errors["A"], errors["A"]
    assert "no contribution of A arrived: A at round 2 answered the roll call, this island at round 1 " \
        "(checkpoints of different rounds" in errors["B"], errors["B"]


class Rotation(Alone):
    """An exchange whose average depends on the vector and the round (no network), recording the rounds: a
    resume that restarts the rotation, or loses the anchor or momentum, ends at other parameters."""

    def __init__(self):
        self.rounds = []

    def average(self, round_index, clique_index, members, me, vector, **route):
        self.rounds.append((round_index, tuple(members)))
        return (vector * np.float32(0.5) + np.float32(round_index)).astype(np.float32)


def post_local_sgd(outer_step, keep_state):
    """A's model, inner SGD, averager (period 2, warmup 1) and torch's PostLocalSGDOptimizer around them."""
    from torch.distributed.optim import PostLocalSGDOptimizer

    model = small_model()
    inner = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    outer = torch.optim.SGD(anchor_parameters(model), lr=0.7, momentum=0.9, nesterov=True) if outer_step else None
    exchange = Rotation()
    averager = CliqueAverager(2, 1, island="A", rounds=ROUNDS, exchange=exchange, outer_optimizer=outer)
    if keep_state:
        averager.keep_state_in(inner)
    return model, PostLocalSGDOptimizer(inner, averager), averager, exchange


def train(model, optimizer, steps, first=0):
    for step in range(first, first + steps):
        optimizer.zero_grad()
        model(torch.full((5, 3), float(step % 3) - 1.0)).square().sum().backward()
        optimizer.step()


def test_the_averager_is_a_torch_model_averager():
    from torch.distributed.algorithms.model_averaging.averagers import ModelAverager

    averager = CliqueAverager(2, island="A", rounds=ROUNDS, exchange=Echo())
    assert isinstance(averager, ModelAverager)
    assert (averager.step, averager.process_group) == (0, None), "a single-process island has no group"


@pytest.mark.parametrize("outer_step, keep_state", [(True, True), (False, True), (False, False)],
                         ids=["outer step, kept", "plain, kept", "plain, step alone"])
def test_a_resume_through_post_local_sgd_continues_the_rotation_bit_for_bit(outer_step, keep_state):
    """7 steps straight through, or 4, a checkpoint of the model and PostLocalSGDOptimizer through torch.save and
    torch.load (weights only), and 3 more in a new job: the same rounds, the same averager state, the same
    bits. Plain averaging needs only the wrapper's "step"; an outer step needs keep_state_in."""
    model, optimizer, averager, exchange = post_local_sgd(outer_step, keep_state)
    train(model, optimizer, 7)

    model, optimizer, _, first = post_local_sgd(outer_step, keep_state)
    train(model, optimizer, 4)
    saved = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, saved)
    saved.seek(0)
    checkpoint = torch.load(saved)
    model, optimizer, resumed, second = post_local_sgd(outer_step, keep_state)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    train(model, optimizer, 3, first=4)

    assert first.rounds + second.rounds == exchange.rounds == [(0, ("A", "B", "C")), (1, ("A", "D")),
                                                               (2, ("A", "B", "C"))]
    assert (resumed.step, resumed.rounds_done) == (averager.step, averager.rounds_done) == (7, 3)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), small_model_after(outer_step, keep_state),
                                                  strict=True))
    if outer_step:
        assert np.array_equal(resumed.anchor, averager.anchor)
        assert torch.equal(resumed.state_dict()["outer_optimizer"]["state"][0]["momentum_buffer"],
                           averager.state_dict()["outer_optimizer"]["state"][0]["momentum_buffer"])


def test_a_resume_keeps_the_numpy_outer_steps_momentum():
    """An averager with the numpy outer step (momentum 0.9): four averagings straight through, or two, its
    state_dict() through torch.save and torch.load, and two more in a new averager, end at the same bits:
    the momentum buffer comes back with the anchor (dropped, the third step would take the gradient alone)."""
    def averager_of():
        return CliqueAverager(1, island="A", rounds=ROUNDS, exchange=Echo(), outer=OuterOptimizer(0.7, 0.9))

    straight_model = torch.nn.Linear(3, 1)
    resumed_model = copy.deepcopy(straight_model)
    straight = averager_of()
    for _ in range(4):
        straight.average_parameters(straight_model.parameters())

    first = averager_of()
    for _ in range(2):
        first.average_parameters(resumed_model.parameters())
    saved = io.BytesIO()
    torch.save(first.state_dict(), saved)
    saved.seek(0)
    resumed = averager_of()
    resumed.load_state_dict(torch.load(saved))
    for _ in range(2):
        resumed.average_parameters(resumed_model.parameters())
    assert np.array_equal(resumed.buffer, straight.buffer)
    assert all(torch.equal(p, q) for p, q in zip(resumed_model.parameters(), straight_model.parameters(),
                                                  strict=True))


def small_model_after(outer_step, keep_state):
    model, optimizer, _, _ = post_local_sgd(outer_step, keep_state)
    train(model, optimizer, 7)
    return list(model.parameters())


def test_a_resume_of_an_outer_step_through_post_local_sgd_alone_is_refused_naming_the_fix():
    """Without keep_state_in, PostLocalSGDOptimizer's checkpoint holds the averager's step and nothing of its
    anchor or momentum: loading it refuses in one line instead of continuing from another anchor."""
    model, optimizer, averager, _ = post_local_sgd(True, False)
    train(model, optimizer, 4)
    state = optimizer.state_dict()
    _, optimizer, resumed, _ = post_local_sgd(True, False)
    with pytest.raises(ValueError) as raised:
        optimizer.load_state_dict(state)
    assert str(raised.value) == (
        "checkpoint field 'step': 4 alone would resume the rotation without the outer step's anchor and momentum "
        "(PostLocalSGDOptimizer saves only the averager's step); call averager.keep_state_in(inner_optimizer) "
        "before saving, or save averager.state_dict() beside the optimizer's")
    assert (resumed.step, resumed.rounds_done, resumed.anchor) == (0, 0, None)


def run_trained_islands(aggregator, job, steps, period, hooked):
    """Islands A-D in threads, each training its own model with SGD on its own data and averaging every
    `period` steps: explicitly after each `optimizer.step()`, or `hooked` inside `LocalSGD`. Returns each
    island's parameters and the steps after which it had averaged."""
    results, errors = {}, []

    def island(name, seed, model):
        inputs = torch.randn((steps, 5, 3), generator=torch.Generator().manual_seed(seed))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        exchange = InwireExchange(aggregator.address, job=job, chunk=64, deadline_s=10)
        averager = CliqueAverager(period, island=name, rounds=ROUNDS, exchange=exchange)
        averaged, seen = [], [None]

        def step(index):
            optimizer.zero_grad()
            model(inputs[index]).square().sum().backward()
            optimizer.step()
            if not hooked:
                averager.average_parameters(model.parameters())
            if averager.last is not seen[0]:
                seen[0] = averager.last
                averaged.append(averager.step)

        try:
            if hooked:
                with LocalSGD(model, optimizer, sync_every=period, averager=averager):
                    for index in range(steps):
                        step(index)
            else:
                for index in range(steps):
                    step(index)
            results[name] = ([p.detach().clone() for p in model.parameters()], averaged)
        except Exception as error:  # the test reports it below
            errors.append(error)
        finally:
            exchange.close()

    # Made here, one after another: small_model seeds torch's global generator, which threads would share.
    models = [small_model() for _ in "ABCD"]
    run_in_threads(island, [(name, seed, model) for seed, (name, model) in enumerate(zip("ABCD", models, strict=True))],
                   errors)
    return results


def test_local_sgd_averages_at_the_same_steps_to_the_same_bits_as_explicit_calls(aggregator):
    """torchft's shape, a context manager on the optimizer's step hook, against the explicit calls: islands
    through the loopback aggregator, 6 steps averaging every 2."""
    explicit = run_trained_islands(aggregator, 1, steps=6, period=2, hooked=False)
    hooked = run_trained_islands(aggregator, 2, steps=6, period=2, hooked=True)
    for name in "ABCD":
        assert hooked[name][1] == explicit[name][1] == ([4] if name == "D" else [2, 4, 6]), name
        assert all(torch.equal(p, q) for p, q in zip(hooked[name][0], explicit[name][0], strict=True)), name
    assert not any(torch.equal(p, q) for p, q in zip(explicit["A"][0], explicit["D"][0], strict=True)), \
        "A's and D's models differ: the comparison would see a missing averaging"


def test_local_sgd_removes_its_hooks_on_exit():
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    averager = CliqueAverager(1, island="A", rounds=ROUNDS, exchange=Echo())
    with LocalSGD(model, optimizer, sync_every=1, averager=averager):
        optimizer.step()
        assert "inwire_averager" in optimizer.state_dict()
    optimizer.step()
    assert averager.step == 1 and "inwire_averager" not in optimizer.state_dict()


def test_local_sgd_refuses_a_sync_every_other_than_the_period():
    averager = CliqueAverager(2, island="A", rounds=ROUNDS, exchange=Echo())
    model = small_model()
    with pytest.raises(ValueError, match="^sync_every 3 is not the averager's period 2; the averager counts the steps"):
        LocalSGD(model, torch.optim.SGD(model.parameters(), lr=0.1), 3, averager=averager)


def test_the_default_deadline_outlasts_a_slow_start_as_torch_collectives_do():
    """The deadline bounds one averaging, waiting for the slowest island included: its default is NCCL's
    collective timeout (10 minutes), not 30 s that one island's slow start trips."""
    exchange = InwireExchange(("127.0.0.1", 9))
    try:
        assert exchange.client.deadline_s == 600.0
    finally:
        exchange.close()
