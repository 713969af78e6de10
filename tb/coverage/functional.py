"""Functional coverage: frame classes (dispositions), slot-state transitions and aggregation events.

Sampled on the golden model that the cocotb scoreboard runs beside the gateware; the scoreboard makes
every output frame and counter of the gateware equal the model's, so a bin hit here was hit by the gateware
with the same outcome. A slot is `empty` (never claimed since reset), `partial` (claimed, fan-in not
reached) or `complete`; a transition is sampled whenever a frame changes a slot.
"""

from inwire.model import JOB_DISPOSITIONS
from inwire.protocol import FRAME_OFFSETS, Disposition, Opcode

SLOT_TRANSITIONS = (
    ("empty", "partial", "claim"),
    ("empty", "complete", "claim"),
    ("partial", "partial", "member"),
    ("partial", "complete", "member"),
    ("partial", "partial", "reclaim"),
    ("partial", "complete", "reclaim"),
    ("partial", "partial", "expire"),
    ("partial", "complete", "expire"),
    ("complete", "partial", "claim"),
    ("complete", "complete", "claim"),
)
"""Every change a slot can go through: claimed when empty or complete (a fan-in of 1 completes it at
once), a new member summed, reclaimed by a newer round of its job, claimed by another owner once its lease
ran out."""

FRAME_CLASSES = tuple(d.name.lower() for d in Disposition)
JOB_CLASSES = tuple(d.name.lower() for d in JOB_DISPOSITIONS)
"""Classes only an aggregator with job tables gives: not bins where the model, like the gateware, holds none."""
RELAYED = Disposition.RELAYED.name.lower()
"""Needs a clique's route to a parent: not a bin where the tables hold no routes (the gateware's)."""
EVENTS = ("results_emitted", "saturations", "slots_reclaimed", "leases_expired", "partials_emitted")
"""Counters whose increase marks an event worth seeing: a result sent, a sum clipped, a slot taken over
by a newer round or after its lease, a partial sent up a reduction tree."""
PARTIAL_SUMMED = "partials_summed"
"""One more event: a partial from a level below summed into a slot."""


def slot_state(slot):
    if slot.key is None:
        return "empty"
    return "complete" if slot.complete else "partial"


def _snapshot(slot):
    return (slot.key, slot.bitmap, slot.complete)


class Coverage:
    """Wraps a model's `process`: counts frame classes and slot transitions of every frame it sees."""

    def __init__(self, model):
        self.model = model
        unreachable = JOB_CLASSES if not model.config.registered else () if model.config.limits.routes else (
            RELAYED,)
        self.classes = {name: 0 for name in FRAME_CLASSES if name not in unreachable}
        self.transitions = dict.fromkeys(SLOT_TRANSITIONS, 0)
        self.events = dict.fromkeys(EVENTS + (PARTIAL_SUMMED,), 0)
        self._process = model.process
        model.process = self.process

    def process(self, frame, now=None):
        model = self.model
        before = [(slot_state(slot), _snapshot(slot)) for slot in model.slots]
        counters = dict(model.counters)
        outputs = self._process(frame, now)
        for name in self.classes:
            if model.counters[name] != counters[name]:
                self.classes[name] += 1
        for name in EVENTS:
            if model.counters[name] != counters[name]:
                self.events[name] += 1
        opcode = FRAME_OFFSETS["opcode"]
        if (len(frame) > opcode and frame[opcode] == Opcode.PARTIAL
                and model.counters["accumulated"] != counters["accumulated"]):
            self.events[PARTIAL_SUMMED] += 1
        reclaimed = model.counters["slots_reclaimed"] != counters["slots_reclaimed"]
        expired = model.counters["leases_expired"] != counters["leases_expired"]
        for (state, snapshot), slot in zip(before, model.slots, strict=True):
            if _snapshot(slot) == snapshot:
                continue
            if reclaimed:
                cause = "reclaim"
            elif expired:
                cause = "expire"
            elif state == "partial" and snapshot[0] == slot.key:
                cause = "member"
            else:
                cause = "claim"
            self.transitions[(state, slot_state(slot), cause)] += 1
        return outputs

    def missing(self):
        """Bins never hit, as readable names."""
        return ([f"class {name}" for name, hits in self.classes.items() if not hits]
                + [f"slot {a}->{b} ({cause})" for (a, b, cause), hits in self.transitions.items() if not hits]
                + [f"event {name}" for name, hits in self.events.items() if not hits])

    def report(self):
        return {
            "classes": self.classes,
            "transitions": {f"{a}->{b} ({cause})": hits for (a, b, cause), hits in self.transitions.items()},
            "events": self.events,
            "missing": self.missing(),
        }
