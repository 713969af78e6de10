# Alveo U200 (xcu200-fsgd2104-2-e): pins, clocks and timing of inwire_alveo_u200
# (hdl/inwire_hdl/alveo.py). Used by constraints/alveo_u200_build.tcl. Not yet run through Vivado.

set_property CFGBVS GND                                [current_design]
set_property CONFIG_VOLTAGE 1.8                        [current_design]
set_property BITSTREAM.GENERAL.COMPRESS true           [current_design]
set_property BITSTREAM.CONFIG.EXTMASTERCCLK_EN {DIV-1} [current_design]
set_property BITSTREAM.CONFIG.SPI_32BIT_ADDR YES       [current_design]
set_property BITSTREAM.CONFIG.SPI_BUSWIDTH 4           [current_design]
set_property BITSTREAM.CONFIG.SPI_FALL_EDGE YES        [current_design]

# 300 MHz board clock (DDR4 channel 0 reference) -> clocking wizard: 250 MHz core, 100 MHz CMAC init/DRP.
set_property -dict {PACKAGE_PIN AY37 IOSTANDARD LVDS} [get_ports clk_300mhz_p]
set_property -dict {PACKAGE_PIN AY38 IOSTANDARD LVDS} [get_ports clk_300mhz_n]
create_clock -period 3.333 -name clk_300mhz [get_ports clk_300mhz_p]

# Status LEDs: QSFP0 aligned, QSFP1 aligned, clocks locked.
set_property -dict {PACKAGE_PIN BC21 IOSTANDARD LVCMOS12 SLEW SLOW DRIVE 8} [get_ports {led[0]}]
set_property -dict {PACKAGE_PIN BB21 IOSTANDARD LVCMOS12 SLEW SLOW DRIVE 8} [get_ports {led[1]}]
set_property -dict {PACKAGE_PIN BA20 IOSTANDARD LVCMOS12 SLEW SLOW DRIVE 8} [get_ports {led[2]}]
set_false_path -to [get_ports {led[*]}]

# QSFP0: GTY quad 231 (GTYE4_CHANNEL_X1Y48..X1Y51), CMACE4_X0Y6, 156.25 MHz MGTREFCLK0_231.
# The CMAC IP locates its transceivers (GT_GROUP_SELECT); the serial pins follow from those sites.
set_property PACKAGE_PIN M11 [get_ports qsfp0_refclk_p]
set_property PACKAGE_PIN M10 [get_ports qsfp0_refclk_n]
create_clock -period 6.400 -name qsfp0_refclk [get_ports qsfp0_refclk_p]
set_property -dict {PACKAGE_PIN BE16 IOSTANDARD LVCMOS12} [get_ports qsfp0_modsell]
set_property -dict {PACKAGE_PIN BE17 IOSTANDARD LVCMOS12} [get_ports qsfp0_resetl]
set_property -dict {PACKAGE_PIN BD18 IOSTANDARD LVCMOS12} [get_ports qsfp0_lpmode]

# QSFP1: GTY quad 230 (GTYE4_CHANNEL_X1Y44..X1Y47), CMACE4_X0Y7, 156.25 MHz MGTREFCLK0_230.
set_property PACKAGE_PIN T11 [get_ports qsfp1_refclk_p]
set_property PACKAGE_PIN T10 [get_ports qsfp1_refclk_n]
create_clock -period 6.400 -name qsfp1_refclk [get_ports qsfp1_refclk_p]
set_property -dict {PACKAGE_PIN AY20 IOSTANDARD LVCMOS12} [get_ports qsfp1_modsell]
set_property -dict {PACKAGE_PIN BC18 IOSTANDARD LVCMOS12} [get_ports qsfp1_resetl]
set_property -dict {PACKAGE_PIN AV22 IOSTANDARD LVCMOS12} [get_ports qsfp1_lpmode]
set_false_path -to [get_ports {qsfp*_modsell qsfp*_resetl qsfp*_lpmode}]

# Clock domains: the core clock, each CMAC's user clock (gt_txusrclk2, 322.27 MHz) and the init clock
# only meet in amaranth.lib.fifo.AsyncFIFO (Gray-coded pointers) and FFSynchronizer/ResetSynchronizer
# chains, so they are asynchronous to one another.
set_clock_groups -asynchronous \
    -group [get_clocks -of_objects [get_pins clock_wizard/clk_out1]] \
    -group [get_clocks -of_objects [get_pins clock_wizard/clk_out2]] \
    -group [get_clocks -of_objects [get_pins cmac0/gt_txusrclk2]] \
    -group [get_clocks -of_objects [get_pins cmac1/gt_txusrclk2]]
