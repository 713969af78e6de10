# Vivado (2022.1 or later) batch build of the Alveo U200 100 GbE design. Not run here: no vendor tools.
#
#   python -m inwire_hdl.alveo --out build/alveo
#   vivado -mode batch -source constraints/alveo_u200_build.tcl -tclargs build/alveo
#
# Creates the two CMAC IPs and the clocking wizard that inwire_alveo_u200.v instantiates, synthesizes,
# places and routes, writes timing/utilization reports and the bitstream, and fails when timing is not met.

set out [file normalize [lindex $argv 0]]
set here [file dirname [file normalize [info script]]]
set part xcu200-fsgd2104-2-e
file mkdir $out/ip
create_project -in_memory -part $part

proc cmac {name core gts} {
    global out
    create_ip -name cmac_usplus -vendor xilinx.com -library ip -module_name $name -dir $out/ip
    set_property -dict [list \
        CONFIG.CMAC_CAUI4_MODE {1} CONFIG.NUM_LANES {4x25} CONFIG.GT_REF_CLK_FREQ {156.25} \
        CONFIG.USER_INTERFACE {AXIS} CONFIG.GT_DRP_CLK {100.00} CONFIG.ENABLE_AXI_INTERFACE {0} \
        CONFIG.INCLUDE_RS_FEC {0} CONFIG.INCLUDE_STATISTICS_COUNTERS {0} \
        CONFIG.TX_FLOW_CONTROL {0} CONFIG.RX_FLOW_CONTROL {0} CONFIG.RX_MAX_PACKET_LEN {9600} \
        CONFIG.CMAC_CORE_SELECT $core CONFIG.GT_GROUP_SELECT $gts \
    ] [get_ips $name]
}
cmac inwire_cmac_qsfp0 CMACE4_X0Y6 X1Y48~X1Y51
cmac inwire_cmac_qsfp1 CMACE4_X0Y7 X1Y44~X1Y47

create_ip -name clk_wiz -vendor xilinx.com -library ip -module_name inwire_core_clk -dir $out/ip
set_property -dict [list \
    CONFIG.PRIM_SOURCE {Differential_clock_capable_pin} CONFIG.PRIM_IN_FREQ {300.000} \
    CONFIG.CLKOUT1_REQUESTED_OUT_FREQ {250.000} \
    CONFIG.CLKOUT2_USED {true} CONFIG.CLKOUT2_REQUESTED_OUT_FREQ {100.000} \
    CONFIG.USE_RESET {true} CONFIG.RESET_TYPE {ACTIVE_HIGH} \
] [get_ips inwire_core_clk]

generate_target all [get_ips]
synth_ip [get_ips]

read_verilog $out/inwire_alveo_u200.v
read_xdc $here/alveo_u200.xdc
synth_design -top inwire_alveo_u200 -part $part
opt_design
place_design
phys_opt_design
route_design

report_timing_summary -max_paths 20 -file $out/timing_summary.rpt
report_utilization -file $out/utilization.rpt
report_clock_interaction -file $out/clock_interaction.rpt
set wns [get_property SLACK [get_timing_paths -max_paths 1 -nworst 1 -setup]]
set whs [get_property SLACK [get_timing_paths -max_paths 1 -nworst 1 -hold]]
puts "inwire: WNS $wns ns, WHS $whs ns"
if {$wns < 0 || $whs < 0} {
    error "inwire: timing not met (see $out/timing_summary.rpt)"
}
write_bitstream -force $out/inwire_alveo_u200.bit
