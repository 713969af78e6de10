"""The protocol table, the numpy codec and the scapy layer describe the same bytes."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import raw

from inwire.layers import Inwire
from inwire.packets import build_frames, group_macs, ipv4_checksums, mac_bytes, parse_frames
from inwire.protocol import (
    AGGREGATION_FIELDS,
    FIELDS_BY_NAME,
    FRAME_FIELDS,
    FRAME_HEADER_BYTES,
    FRAME_OFFSETS,
    INWIRE_PORT,
    MAX_ELEMENTS_PER_FRAME,
    MTU_BYTES,
    TRAILER_OPCODES,
    Opcode,
    frame_bytes,
    multicast_mac,
)

SETTABLE = [field for field in AGGREGATION_FIELDS
            if field.name not in ("count", "magic", "version", "reserved")]


def field_values():
    def strategy(field):
        if field.signed:
            return st.integers(-(1 << (field.bits - 1)), (1 << (field.bits - 1)) - 1)
        return st.integers(0, (1 << field.bits) - 1)
    return st.fixed_dictionaries({field.name: strategy(field) for field in SETTABLE})


ADDRESS_FIELDS = ("group", "hop1", "hop2")
"""IPv4 addresses: scapy shows them dotted."""


def dotted(value):
    return ".".join(str(value >> shift & 0xFF) for shift in (24, 16, 8, 0))


elements_strategy = st.lists(st.integers(-2**31, 2**31 - 1), min_size=0, max_size=64)


def test_header_is_128_bytes_and_fields_do_not_overlap():
    assert FRAME_HEADER_BYTES == 128
    positions = [(FRAME_OFFSETS[field.name], field.nbytes) for field in FRAME_FIELDS]
    for (offset, size), (next_offset, _) in zip(positions, positions[1:], strict=False):
        assert offset + size == next_offset


def test_largest_result_fits_the_mtu():
    assert frame_bytes(MAX_ELEMENTS_PER_FRAME, Opcode.RESULT) - 14 <= MTU_BYTES
    assert frame_bytes(MAX_ELEMENTS_PER_FRAME + 1, Opcode.RESULT) - 14 > MTU_BYTES


@settings(max_examples=150, deadline=None)
@given(values=field_values(), elements=st.lists(st.integers(-2**31, 2**31 - 1), max_size=300))
def test_numpy_frame_dissects_in_scapy_to_the_same_values(values, elements):
    status = 1 if values["opcode"] in TRAILER_OPCODES else None
    frame = build_frames(np.array([elements], dtype=np.int64).reshape(1, -1), status=status, **values)[0]
    packet = Ether(bytes(frame))
    header = packet[Inwire]
    for name, value in values.items():
        expected = value
        if name in ADDRESS_FIELDS:
            expected = dotted(value)
        assert getattr(header, name) == expected, name
    assert header.count == len(elements)
    assert header.elements == elements
    if status is not None:
        assert header.status == status
    assert packet[UDP].dport == INWIRE_PORT
    assert packet[IP].chksum == IP(raw(packet[IP])).chksum
    assert IP(raw(packet[IP])).len == len(frame) - 14


@settings(max_examples=150, deadline=None)
@given(values=field_values(), elements=elements_strategy)
def test_scapy_built_frame_equals_numpy_built_frame(values, elements):
    scapy_values = dict(values)
    scapy_values.update({name: dotted(values[name]) for name in ADDRESS_FIELDS})
    packet = (Ether(dst="01:00:5e:00:00:01", src="02:00:00:00:00:02")
              / IP(src="10.0.0.2", dst="10.0.0.1", id=0, flags="DF", ttl=64)
              / UDP(chksum=0) / Inwire(elements=elements, **scapy_values))
    status = 0 if values["opcode"] in TRAILER_OPCODES else None
    frame = build_frames(np.array([elements], dtype=np.int64).reshape(1, -1), eth_dst="01:00:5e:00:00:01",
                         eth_src="02:00:00:00:00:02", ip_src=0x0A000002, ip_dst=0x0A000001, status=status,
                         **values)[0]
    assert raw(packet) == bytes(frame)


@settings(max_examples=50, deadline=None)
@given(values=field_values(), count=st.integers(0, 32), packets=st.integers(1, 8), seed=st.integers(0, 2**32 - 1))
def test_parse_frames_inverts_build_frames(values, count, packets, seed):
    elements = np.random.default_rng(seed).integers(-2**31, 2**31, size=(packets, count))
    headers, parsed = parse_frames(build_frames(elements, **values))
    assert np.array_equal(parsed, elements)
    for name, value in values.items():
        assert np.all(headers[name] == value), name
    assert np.all(headers["count"] == count)


def test_vectorized_checksums_match_scapy_for_many_packets():
    rng = np.random.default_rng(7)
    frames = build_frames(np.zeros((50, 3), dtype=np.int32), ip_src=rng.integers(0, 2**32, 50),
                          ip_dst=rng.integers(0, 2**32, 50), ip_id=rng.integers(0, 2**16, 50))
    for frame, checksum in zip(frames, ipv4_checksums(frames), strict=True):
        packet = Ether(bytes(frame))
        assert packet[IP].chksum == checksum
        del packet[IP].chksum
        assert Ether(raw(packet))[IP].chksum == checksum


@pytest.mark.parametrize("opcode", [Opcode.RESULT, Opcode.PARTIAL])
def test_result_and_partial_trailer_dissects_as_status(opcode):
    frame = build_frames(np.array([5, -5]), opcode=opcode, status=1)[0]
    header = Ether(bytes(frame))[Inwire]
    assert header.elements == [5, -5] and header.status == 1
    assert len(frame) == frame_bytes(2, opcode)


def test_a_contribution_has_no_trailer():
    frame = build_frames(np.array([5, -5]), opcode=Opcode.CONTRIBUTION)[0]
    header = Ether(bytes(frame))[Inwire]
    assert header.elements == [5, -5] and header.status is None
    assert len(frame) == frame_bytes(2, Opcode.CONTRIBUTION)


def test_multicast_mac_takes_the_low_23_bits():
    assert multicast_mac(0xEF_81_02_03) == 0x01005E010203
    assert np.array_equal(group_macs([0xEF_FF_FF_FF])[0], mac_bytes("01:00:5e:7f:ff:ff"))


@pytest.mark.parametrize("bad, error", [
    ({"elements": np.zeros((2, 2, 2), dtype=np.int32)}, ValueError),
    ({"elements": np.zeros(3, dtype=np.float32)}, TypeError),
    ({"elements": np.array([2**31])}, ValueError),
    ({"elements": np.zeros(3, dtype=np.int32), "slot": 70000}, ValueError),
    ({"elements": np.zeros(3, dtype=np.int32), "exponent": 200}, ValueError),
    ({"elements": np.zeros(3, dtype=np.int32), "colour": 1}, ValueError),
    ({"elements": np.zeros(3, dtype=np.int32), "ip_len": 1}, ValueError),
    ({"elements": np.zeros(3, dtype=np.int32), "job": 1.5}, TypeError),
    ({"elements": np.zeros((2, 3), dtype=np.int32), "sender": [1, 2, 3]}, ValueError),
    ({"elements": np.zeros(3, dtype=np.int32), "eth_dst": "01:02"}, ValueError),
    ({"elements": np.zeros(3, dtype=np.int32), "eth_dst": 1 << 49}, ValueError),
])
def test_build_frames_rejects_bad_input(bad, error):
    with pytest.raises(error):
        build_frames(**bad)


@pytest.mark.parametrize("frames", [np.zeros((2, 100), dtype=np.uint8), np.zeros((2, 130), dtype=np.uint8),
                                    np.zeros((2, 2, 200), dtype=np.uint8)])
def test_parse_frames_rejects_bad_shapes(frames):
    with pytest.raises(ValueError):
        parse_frames(frames)


def test_field_table_names_are_unique():
    assert len(FIELDS_BY_NAME) == len(FRAME_FIELDS)
