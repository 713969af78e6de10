"""Every mutant of inwire_hdl.mutants elaborates and is not the real aggregator.

An inside mutant overrides a public point of one component; were that point renamed, the override would be
dead code and the mutant the real aggregator, scoring a kill nobody can earn. So each inside mutant's
component is written as RTLIL beside the real one and must differ, its other components being the real
ones. A port
mutant wraps the real aggregator; its wrapper is written around a stand-in with the same ports and compared
with the wrapper that adds no fault.
"""

import warnings

import pytest
from amaranth.back import rtlil
from amaranth.hdl import Module
from amaranth.lib import wiring

from inwire.model import AggregatorConfig
from inwire_hdl import mutants
from inwire_hdl.aggregator import Aggregator
from inwire_hdl.job_table import TREE_LIMITS

CONFIG = AggregatorConfig(slots=2, max_elements=8, max_fanin=4, registered=True, limits=TREE_LIMITS)
"""Job tables with routes: the tree's mutants break what only such tables have."""
WIDTH = 8
COMPONENTS = ("classifier", "slot_table", "decider", "assembler")
INSIDE = {"stale_memory": "assembler", "no_lease": "decider", "lease_early": "decider",
          "sender_overlap": "slot_table", "no_route": "classifier", "hops_kept": "classifier",
          "stale_claims": "decider", "lease_unwrapped": "decider", "stamp_at_claim": "decider",
          "carry_lost": "assembler", "carry_counted": "assembler", "hop2_expect_lost": "classifier",
          "members_low32": "classifier", "partials_resend_uncounted": "assembler", "source_route": "classifier",
          "token_unchecked": "classifier", "source_unchecked": "classifier", "partial_to_group": "classifier",
          "relay_twice": "decider"}
"""Each inside mutant and the component it breaks."""
PORT = [name for name in mutants.MUTANTS if name not in INSIDE]

# The aggregators built only to take a component from are never elaborated whole.
pytestmark = pytest.mark.filterwarnings("ignore:.*created but never used")


def rtlil_of(component):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return rtlil.convert(component, emit_src=False)


@pytest.fixture(scope="module")
def real():
    aggregator = Aggregator(CONFIG, WIDTH)
    return aggregator, {part: rtlil_of(getattr(aggregator, part)) for part in COMPONENTS}


def test_every_mutant_is_inside_or_at_the_ports():
    built = {name: mutants.build(name, CONFIG, WIDTH, None) for name in mutants.MUTANTS}
    assert {name for name, dut in built.items() if not isinstance(dut, mutants.PortMutant)} == set(INSIDE)


@pytest.mark.parametrize("name", sorted(INSIDE))
def test_an_inside_mutant_changes_its_component_only(name, real):
    aggregator, real_rtlil = real
    mutant, broken = mutants.build(name, CONFIG, WIDTH, None), INSIDE[name]
    assert rtlil_of(getattr(mutant, broken)) != real_rtlil[broken]
    for part in COMPONENTS:
        if part != broken:
            assert type(getattr(mutant, part)) is type(getattr(aggregator, part)), part
    assert mutant.decider.lease == aggregator.decider.lease or broken == "decider"


class _SamePorts(wiring.Component):
    """A stand-in for the aggregator inside a port mutant: its ports, no logic."""

    def elaborate(self, platform):
        return Module()


def wrapper_rtlil(name):
    """The RTLIL of port mutant `name`'s wrapper around a stand-in (None: the wrapper adding no fault)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dut = mutants.PortMutant(name or PORT[0], CONFIG, WIDTH, None)
    dut.inner = _SamePorts(dict(dut.inner.signature.members))
    dut.name = name
    return rtlil_of(dut)


@pytest.fixture(scope="module")
def faultless_wrapper():
    return wrapper_rtlil(None)


@pytest.mark.parametrize("name", PORT)
def test_a_port_mutant_changes_its_wrapper(name, faultless_wrapper):
    assert wrapper_rtlil(name) != faultless_wrapper
