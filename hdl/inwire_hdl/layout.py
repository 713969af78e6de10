"""The frame header as Amaranth data layouts, derived from `inwire.protocol`.

A stream carries byte k of a frame in the lowest lane first (AXI-Stream order: byte k of a beat sits in
tdata[8k+7:8k]). Capturing the 128 header bytes in that order gives a `FRAME_HEADER` view whose fields
are byte arrays in wire order; `field_value` and `field_bytes` are the one place where network byte
order is turned into numbers and back.
"""

from amaranth.hdl import Cat, Value, signed, unsigned
from amaranth.lib import data

from inwire.protocol import FIELDS_BY_NAME, FRAME_FIELDS, RESULT_TRAILER_FIELDS


def _byte_layout(fields):
    return data.StructLayout({field.name: data.ArrayLayout(unsigned(8), field.nbytes) for field in fields})


FRAME_HEADER = _byte_layout(FRAME_FIELDS)
"""Ethernet, IPv4, UDP and aggregation headers as captured from the stream, 128 bytes."""

RESULT_TRAILER = _byte_layout(RESULT_TRAILER_FIELDS)

_TRAILER_FIELDS = {field.name: field for field in RESULT_TRAILER_FIELDS}


def _field(name):
    return FIELDS_BY_NAME.get(name) or _TRAILER_FIELDS[name]


def field_shape(name):
    field = _field(name)
    return signed(field.bits) if field.signed else unsigned(field.bits)


def field_value(view, name):
    """The numeric value of field `name` of a header view, converted from network byte order."""
    field = _field(name)
    wire_bytes = getattr(view, name)
    value = Cat(*(wire_bytes[index] for index in reversed(range(field.nbytes))))
    return value.as_signed() if field.signed else value


def field_bytes(value, name):
    """`value` as the bytes of field `name` in wire order, to assign to that field of a header view."""
    value = Value.cast(value)
    return Cat(*(value[8 * index:8 * index + 8] for index in reversed(range(_field(name).nbytes))))
