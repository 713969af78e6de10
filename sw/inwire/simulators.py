"""The simulators and beat widths the gateware is simulated with, and the `SIMULATOR[:WIDTH]` string that
names them (`inwire replay --sim`, `serve --sim`, `stream --target sim:`, `train-dist --sim`).

Here, in the host package, so that a host module parses the string without importing the gateware package
(`inwire_hdl`, which takes these from here)."""

SIMULATORS = ("icarus", "verilator")
"""The HDL simulators the cocotb drivers run on (`inwire replay --sim`, `serve --sim`, `stream --target sim:`)."""
DATA_WIDTHS = (8, 16, 32, 64)
"""Beat widths in bytes the aggregator is built for: every one divides the 128-byte header."""
SIM_DEFAULT_WIDTH = 64
"""The widest beat takes the fewest simulated cycles per frame."""


def parse_simulator(text: str) -> tuple[str, int]:
    """'SIMULATOR[:WIDTH]' as (simulator, data width in bytes); ValueError when it names neither."""
    simulator, _, width = text.partition(":")
    if simulator not in SIMULATORS or (width and width not in map(str, DATA_WIDTHS)):
        raise ValueError(f"sim:SIMULATOR[:WIDTH] takes a simulator among {', '.join(SIMULATORS)} and a width "
                         f"among {', '.join(map(str, DATA_WIDTHS))}")
    return simulator, int(width or SIM_DEFAULT_WIDTH)
