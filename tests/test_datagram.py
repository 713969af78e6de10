"""The datagram layer: payloads read without padding them back into frames."""

import numpy as np

from inwire.datagram import (
    PAYLOAD_HEADER_BYTES,
    PAYLOAD_OFFSET,
    island_address,
    opcode_of,
    parse_payload_header,
    parse_result,
    parse_stats_reply,
    payload_of,
    stats_request,
    wrap,
)
from inwire.model import Aggregator, AggregatorConfig
from inwire.packets import build_frames, parse_header
from inwire.protocol import AGGREGATION_FIELDS, COUNTERS, FRAME_OFFSETS, INT32_MAX, VERSIONS, Opcode

CONFIG = AggregatorConfig()


def _result(values, version=2, **route):
    """The model's answer to one contribution per row of `values`: a result, or with `route` (hop1 ...) a
    partial."""
    frames = build_frames(np.asarray(values), ip_dst=CONFIG.ip, fanin=len(values), sender=list(range(len(values))),
                          group=0xEF000001, job=5, chunk=64, exponent=-3, version=version, **route)
    model = Aggregator(CONFIG)
    return payload_of([out for frame in frames for out in model.process(bytes(frame))][0])


def test_payload_starts_at_the_magic_and_its_header_has_every_aggregation_field():
    assert PAYLOAD_OFFSET == FRAME_OFFSETS["magic"] == 42
    record = parse_payload_header(_result([[1, 2], [3, 4]]))
    assert [field.name for field in AGGREGATION_FIELDS] == list(record.dtype.names)
    assert record.dtype.itemsize == PAYLOAD_HEADER_BYTES


def test_result_is_read_with_its_sums_and_overflow_flag():
    result = parse_result(_result([[1, -2], [3, 4]]))
    assert result.elements.tolist() == [4, 2] and not result.overflow
    assert (int(result.header["job"]), int(result.header["chunk"]), int(result.header["exponent"])) == (5, 64, -3)
    assert parse_result(_result([[INT32_MAX, 0], [1, 0]])).overflow


def test_results_of_both_versions_and_partials_are_read():
    """A version 1 contribution is answered in version 1, and read like a version 2 result; a partial is read
    only when asked for, and a version the aggregator does not know is not read."""
    for version in (1, 2):
        result = parse_result(_result([[1, -2], [INT32_MAX, 4]], version=version))
        assert int(result.header["version"]) == version
        assert result.elements.tolist() == [INT32_MAX, 2] and result.overflow
    partial = _result([[1, -2], [3, 4]], hop1=0x0A495702)
    assert parse_result(partial) is None
    read = parse_result(partial, opcode=Opcode.PARTIAL)
    assert read.elements.tolist() == [4, 2] and int(read.header["bitmap"]) == 0b11
    unknown = bytearray(_result([[1, 2], [3, 4]]))
    unknown[2] = max(VERSIONS) + 1
    assert parse_result(bytes(unknown)) is None


def test_anything_but_a_whole_result_is_none():
    payload = _result([[1, 2], [3, 4]])
    contribution = payload_of(build_frames(np.array([1, 2]), fanin=2, group=0xEF000001)[0])
    for other in (payload[:-1], payload + bytes(4), payload[:PAYLOAD_HEADER_BYTES - 1], b"", contribution,
                  b"\x00\x00" + payload[2:]):
        assert parse_result(other) is None


def test_stats_request_round_trip_through_the_model():
    request = stats_request(job=3)
    assert opcode_of(request) == Opcode.STATS_REQUEST and opcode_of(b"ab") is None
    frame = wrap(request, ("10.0.0.2", 4000), ("10.73.87.1", CONFIG.port), CONFIG.mac.to_bytes(6, "big"))
    assert parse_header(frame + bytes(128))["udp_sport"] == 4000
    reply = Aggregator(CONFIG).process(frame)[0]
    counters = parse_stats_reply(payload_of(reply))
    assert list(counters) == list(COUNTERS) and counters["frames_in"] == 0  # the frames before it
    assert parse_stats_reply(request) is None
    reply = Aggregator(CONFIG).process(wrap(stats_request(version=1), ("10.0.0.2", 4000), ("10.73.87.1", CONFIG.port),
                                            CONFIG.mac.to_bytes(6, "big")))[0]
    assert payload_of(reply)[2] == 1 and parse_stats_reply(payload_of(reply))["frames_in"] == 0


def test_islands_have_one_address_plan():
    assert island_address(0) == ("10.73.1.1", 0x02_49_57_01_00_00)
    assert island_address(8) == ("10.73.1.9", 0x02_49_57_01_00_08)
