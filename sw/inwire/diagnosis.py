"""Why a stream went wrong: the aggregator's counters and the kernel's socket drops, read as causes.

`inwire stream` asks the target for its counters before and after the run (a stats request). When a
round failed, or when the islands retransmitted more than the datagrams they dropped on purpose explain
(each one holds up its whole clique, so up to the largest clique's size in retransmissions), `diagnose`
names each counter that moved and what to do about it, one line per cause.
"""

from .protocol import Disposition


def needs_diagnosis(report, largest_clique):
    """A round failed, or retransmissions answered losses the islands did not cause themselves (a datagram
    dropped on purpose makes every member of its clique retransmit once)."""
    return not report["finished"] or report["retransmits"] > largest_clique * report["dropped"]


def drop_line(disposition, frames, context):
    """The line naming `frames` dropped as `disposition`: its remedy from the table, with `context`'s
    {chunk}, {slots_needed} and {where} filled in, or else its meaning."""
    name = disposition.name.lower()
    if disposition.remedy:
        return f"the aggregator dropped {frames} frames as {name}: {disposition.remedy.format(**context)}"
    return f"the aggregator dropped {frames} frames as {name} ({disposition.meaning})"


def refusal_lines(report):
    """Why a registered run's islands refused results: `results_from_elsewhere` of its `results_refused` came
    from another address than the aggregator's, the rest were results without the job's version and token."""
    refused = report["results_refused"]
    elsewhere = min(report.get("results_from_elsewhere", 0), refused)
    lines = []
    if elsewhere:
        lines.append(f"the islands refused {elsewhere} datagrams from another address than the aggregator's they "
                     f"sent to: a registered job's results count only from there (a relay or NAT between them "
                     f"and the aggregator rewrites the source, or another host sends to the islands' ports)")
    if refused > elsewhere:
        lines.append(f"the islands refused {refused - elsewhere} results without their job's version and token: "
                     f"results of another job, or forged ones, reach the islands' ports")
    return lines


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
    context = {"chunk": report["chunk"], "slots_needed": report["slots_needed"],
               "where": f"slot {failed_slot}" if failed_slot is not None else "slots this run uses"}
    lines = [drop_line(disposition, moved[disposition.name.lower()], context) for disposition in Disposition
             if disposition.name.startswith("DROP_") and not disposition.retransmission
             and disposition.name.lower() in moved]
    kernel = kernel or {}
    if kernel.get("aggregator"):
        lines.append(f"the kernel dropped {kernel['aggregator']} datagrams at the aggregator's socket (receive "
                     f"buffer full); start inwire serve with a larger --receive-buffer (and raise "
                     f"net.core.rmem_max), or lower --window")
    if kernel.get("islands"):
        lines.append(f"the kernel dropped {kernel['islands']} datagrams at the islands' sockets (receive buffer "
                     f"full); lower --window")
    if report.get("results_refused"):
        lines += refusal_lines(report)
    elif (target_kind == "udp" and not report.get("registered") and moved.get("results_emitted")
            and report["results_checked"] == 0):
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
