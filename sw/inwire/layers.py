"""The aggregation header as a scapy layer, generated from the protocol table.

Bound to UDP port INWIRE_PORT, so `Ether(raw)` dissects inwire frames and
`Ether()/IP()/UDP()/Inwire(opcode="contribution", elements=[...])` builds them.
"""

from scapy.fields import (
    ByteEnumField,
    ByteField,
    ConditionalField,
    FieldListField,
    IntField,
    IPField,
    LongField,
    ShortField,
    SignedByteField,
    SignedIntField,
    SignedLongField,
    SignedShortField,
    StrFixedLenField,
    XLongField,
    XShortField,
)
from scapy.layers.inet import UDP
from scapy.packet import Packet, bind_bottom_up, bind_top_down

from .protocol import (
    AGGREGATION_FIELDS,
    INWIRE_PORT,
    MAGIC,
    RESULT_TRAILER_FIELDS,
    TRAILER_OPCODES,
    VERSION,
    Opcode,
)

FIELD_DEFAULTS = {"magic": MAGIC, "version": VERSION, "opcode": Opcode.CONTRIBUTION, "fanin": 1,
                  "group": "239.0.0.1"}

SPECIAL_FIELDS = {
    "magic": lambda name, default: XShortField(name, default),
    "opcode": lambda name, default: ByteEnumField(name, default, {op.value: op.name.lower() for op in Opcode}),
    "group": lambda name, default: IPField(name, default),
    "hop1": lambda name, default: IPField(name, "0.0.0.0"),
    "hop2": lambda name, default: IPField(name, "0.0.0.0"),
    # Member bitmaps read best in hex.
    "bitmap": lambda name, default: XLongField(name, default),
    "expect": lambda name, default: XLongField(name, default),
    "hop1_expect": lambda name, default: XLongField(name, default),
    "hop2_expect": lambda name, default: XLongField(name, default),
    "count": lambda name, default: ShortField(name, None),
}

FIELD_BY_SIZE = {1: ByteField, 2: ShortField, 4: IntField, 8: LongField}
SIGNED_FIELD_BY_SIZE = {1: SignedByteField, 2: SignedShortField, 4: SignedIntField, 8: SignedLongField}


def _scapy_field(field):
    default = FIELD_DEFAULTS.get(field.name, 0)
    if field.name in SPECIAL_FIELDS:
        return SPECIAL_FIELDS[field.name](field.name, default)
    by_size = SIGNED_FIELD_BY_SIZE if field.signed else FIELD_BY_SIZE
    if field.nbytes in by_size:
        return by_size[field.nbytes](field.name, default)
    return StrFixedLenField(field.name, b"\x00" * field.nbytes, length=field.nbytes)


class Inwire(Packet):
    name = "inwire"
    fields_desc = [_scapy_field(field) for field in AGGREGATION_FIELDS] + [
        FieldListField("elements", [], SignedIntField("", 0), count_from=lambda pkt: pkt.count,
                       max_count=2**16),
    ] + [ConditionalField(_scapy_field(field), lambda pkt: pkt.opcode in TRAILER_OPCODES)
         for field in RESULT_TRAILER_FIELDS]

    def post_build(self, packet, payload):
        if self.count is None:
            offset = sum(field.nbytes for field in AGGREGATION_FIELDS[:_field_index("count")])
            packet = packet[:offset] + len(self.elements).to_bytes(2, "big") + packet[offset + 2:]
        return packet + payload

    def mysummary(self):
        return self.sprintf("inwire v%version% %opcode% job=%job% round=%round% clique=%clique% slot=%slot% "
                            "sender=%sender%/%fanin% count=%count% bitmap=%bitmap%")


def _field_index(name):
    return [field.name for field in AGGREGATION_FIELDS].index(name)


bind_bottom_up(UDP, Inwire, dport=INWIRE_PORT)
bind_bottom_up(UDP, Inwire, sport=INWIRE_PORT)
bind_top_down(UDP, Inwire, sport=INWIRE_PORT, dport=INWIRE_PORT)
