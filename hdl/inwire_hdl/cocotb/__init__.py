"""cocotb drivers the shipped commands run in the simulator: `inwire replay` (`replay`), the co-simulation
behind `--sim` (`cosim`) and the gateware benchmark (`bench`), with the testbench (`testbench.TB`) and the
frame builders (`traffic`) that tb/ reuses. The cocotb runner names them as dotted modules,
e.g. `test_module="inwire_hdl.cocotb.replay"`; they import cocotb, so only a simulation imports them.
"""
