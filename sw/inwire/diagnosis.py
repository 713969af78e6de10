"""Why a stream went wrong: the aggregator's counters and the kernel's socket drops, read as causes.

`inwire stream` asks the target for its counters before and after the run (a stats request). When a
round failed, or when the islands retransmitted more than the datagrams they dropped on purpose explain
(each one holds up its whole clique, so up to the largest clique's size in retransmissions), `diagnose`
names each counter that moved and what to do about it, one line per cause.
"""

from .protocol import DISPOSITION_MEANING, Disposition

EXPLAINED = ("drop_count", "drop_slot", "drop_collision", "drop_fanin", "drop_ip_fragment", "drop_stale",
             "drop_route")
"""Drop counters with a cause of their own below; any other drop counter that moved is named with its
meaning from the protocol ..."""
EXPECTED = ("drop_duplicate", "drop_no_result")
"""... except these, which retransmissions cause by themselves (a member summed already, a request for a
result not yet there)."""


def needs_diagnosis(report, largest_clique):
    """A round failed, or retransmissions answered losses the islands did not cause themselves (a datagram
    dropped on purpose makes every member of its clique retransmit once)."""
    return not report["finished"] or report["retransmits"] > largest_clique * report["dropped"]


def diagnose(report, target_kind, largest_clique, failed_slot=None, kernel=None):
    """Lines naming what the counters say went wrong and what to do; [] when nothing needs explaining.

    `report` is the stream report (with the counters' difference under "aggregator"), `target_kind` the
    kind of --target ('udp', 'pcap', 'sim', 'iface'), `largest_clique` the most members of a clique,
    `failed_slot` the slot of the chunk a failed round
    gave up on, `kernel` {"aggregator": n, "islands": n} datagrams the kernel dropped during the run
    (None where the OS does not say)."""
    if not needs_diagnosis(report, largest_clique):
        return []
    counters = report["aggregator"]
    if counters is None:
        return ["the target did not answer a stats request after the run, so its counters cannot say why"]
    moved = {name: value for name, value in counters.items() if value > 0}
    lines = []
    if "drop_count" in moved:
        lines.append(f"the aggregator dropped {moved['drop_count']} contributions as drop_count: --chunk "
                     f"{report['chunk']} is above its maximum elements per frame; lower --chunk, or start "
                     f"inwire serve with --max-elements {report['chunk']} (the gateware: --elements)")
    if "drop_slot" in moved:
        lines.append(f"the aggregator dropped {moved['drop_slot']} contributions as drop_slot: the run needs "
                     f"{report['slots_needed']} slots (4 x cliques x --window), more than it has; lower "
                     f"--window, or start inwire serve with --slots {report['slots_needed']}")
    if "drop_collision" in moved:
        where = f"slot {failed_slot}" if failed_slot is not None else "slots this run uses"
        lines.append(f"collision with another job on {where}: the aggregator dropped {moved['drop_collision']} "
                     f"contributions as drop_collision, because another job's unfinished round holds them; "
                     f"run again once that job has finished or been reclaimed, or use another aggregator")
    if "drop_stale" in moved:
        lines.append(f"the aggregator refused {moved['drop_stale']} stale duplicates (drop_stale): delayed or "
                     f"duplicated copies of earlier chunks or rounds that arrived after their slot had moved on; "
                     f"they never evict a newer result, so they only cost bandwidth; a network that delays "
                     f"datagrams this much may need a larger --timeout-ms")
    if "drop_route" in moved:
        lines.append(f"the aggregator refused {moved['drop_route']} frames as drop_route: the schedule's tree "
                     f"names a next aggregator that is this one, the sender, or outside its upstream prefix; "
                     f"start inwire serve with --upstream covering the tree's aggregators")
    if "drop_fanin" in moved:
        lines.append(f"the aggregator dropped {moved['drop_fanin']} contributions as drop_fanin: a clique of "
                     f"the schedule is larger than its maximum fan-in")
    if "drop_ip_fragment" in moved:
        lines.append(f"the aggregator dropped {moved['drop_ip_fragment']} IPv4 fragments: --chunk "
                     f"{report['chunk']} needs a larger MTU on the path, or lower --chunk")
    for name in sorted(set(moved) - set(EXPLAINED) - set(EXPECTED)):
        if name.startswith("drop_"):
            meaning = DISPOSITION_MEANING[Disposition[name.upper()]]
            lines.append(f"the aggregator dropped {moved[name]} frames as {name} ({meaning})")
    kernel = kernel or {}
    if kernel.get("aggregator"):
        lines.append(f"the kernel dropped {kernel['aggregator']} datagrams at the aggregator's socket (receive "
                     f"buffer full); start inwire serve with a larger --receive-buffer (and raise "
                     f"net.core.rmem_max), or lower --window")
    if kernel.get("islands"):
        lines.append(f"the kernel dropped {kernel['islands']} datagrams at the islands' sockets (receive buffer "
                     f"full); lower --window")
    if (target_kind == "udp" and moved.get("results_emitted") and report["results_checked"] == 0):
        lines.append(f"the aggregator sent {moved['results_emitted']} results but none reached the islands: it "
                     f"multicasts them to each clique's group, which is not routed here; on one machine start "
                     f"inwire serve with --unicast")
    if not lines and report["dropped"] and not report["finished"]:
        lines.append(f"--loss dropped {report['dropped']} datagrams on purpose and a chunk ran out of "
                     f"retransmissions; raise --retries")
    elif not lines:
        lines.append("the aggregator's counters show no drop: results were lost on the way back or came late; "
                     "raise --timeout-ms")
    return lines
