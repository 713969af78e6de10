"""Ethernet CRC-32 (IEEE 802.3 FCS) as parallel XOR networks.

The CRC is the reflected polynomial 0xEDB88320 with an all-ones initial value and inverted output, so
`zlib.crc32(frame)` equals `~next(...)` after the frame's bytes. Running the same register over a frame
*and* its FCS leaves the constant `CRC32_RESIDUE`, which is how a receiver checks the FCS without knowing
where the frame ends until it has ended.
"""

from functools import cache

from amaranth.hdl import Cat, Const, Value

CRC32_POLY = 0xEDB88320
CRC32_INIT = 0xFFFFFFFF
CRC32_RESIDUE = 0xDEBB20E3


def _step_bitwise(state, data, nbits):
    """One software CRC step over `nbits` data bits, LSB first, as in `zlib.crc32` without inversion."""
    for bit in range(nbits):
        feedback = (state ^ (data >> bit)) & 1
        state >>= 1
        if feedback:
            state ^= CRC32_POLY
    return state


@cache
def _equations(nbytes):
    """For each bit of the next state, the masks of the current-state bits and data bits it XORs.

    The step is linear over GF(2), so feeding one-hot states and data words recovers its matrix.
    """
    nbits = 8 * nbytes
    from_state = [_step_bitwise(1 << bit, 0, nbits) for bit in range(32)]
    from_data = [_step_bitwise(0, 1 << bit, nbits) for bit in range(nbits)]
    equations = []
    for out in range(32):
        state_mask = sum(1 << bit for bit in range(32) if from_state[bit] >> out & 1)
        data_mask = sum(1 << bit for bit in range(nbits) if from_data[bit] >> out & 1)
        equations.append((state_mask, data_mask))
    return equations


def _xor_of(value, mask):
    bits = [value[bit] for bit in range(len(value)) if mask >> bit & 1]
    if not bits:
        return Const(0, 1)
    return Cat(*bits).xor()


def crc32_next(state, data):
    """The CRC-32 register after absorbing `data` (a multiple of 8 bits, byte 0 in bits 7..0)."""
    state, data = Value.cast(state), Value.cast(data)
    assert len(state) == 32 and len(data) % 8 == 0 and len(data) > 0
    return Cat(*(_xor_of(state, state_mask) ^ _xor_of(data, data_mask)
                 for state_mask, data_mask in _equations(len(data) // 8)))


def crc32_software(data: bytes, state=CRC32_INIT):
    """Reference for the gateware equations (the register value, not inverted)."""
    for byte in data:
        state = _step_bitwise(state, byte, 8)
    return state
