"""The synchronization strategies timed on the emulated network, beside the cost model's predictions.

Every strategy sums the same vector of every island once (`vector_bytes` of int32 through inwire, as many
float32 through gloo), several times, each repetition started at one wall-clock instant in every city:

- `schedule`: the planner's schedule for the scaled topology (one period: its rounds one after another,
  each started when the last has ended everywhere, as the cost model times a period), software aggregators
  (`inwire serve`) in its cities, chained along its reduction trees;
- `rotation`: rotating cliques, the planner's `grid2d` baseline (two rounds of 3+3+3 for nine islands), timed
  as `schedule` is;
- `global_clique`: every island in one clique at the aggregation city the model finds fastest;
- `global_tree`: the same with in-path reduction along the model's tree (every aggregating city on the way
  sums what it forwards);
- `host_tree`: a host-side tree all-reduce over TCP without any aggregator (`inwire.lab.hosttree`): each
  island's host sums its children's partials with its own vector along the latency-shortest-path tree
  from the root the model finds fastest, and passes the result back down (the planner's `host-tree`);
- `gloo`: `torch.distributed.all_reduce` (gloo, TCP) among the islands, ranks in the model's ring order;
  predicted as the model's ring exchange;
- `mpi_ring`, `mpi_tree`: Open MPI's `MPI_Allreduce` (mpi4py, TCP) among the islands, locked to its ring
  (ranks in the model's ring order, predicted as the model's ring exchange) or to a reduce and a broadcast
  along a binary tree of the ranks (root and ranks in the host tree's order, predicted as the model's host
  tree, which is a latency-shortest-path tree: the binary tree is not that tree);
- `host_tree_tuned`, `gloo_tuned`: the same over TCP tuned (`emulator.TCP_TUNED`); the others run with the
  namespaces' own TCP settings, which the report states beside each.

The lab routes no multicast, so every aggregator sends each member its copy (`inwire serve --unicast`), and
the model is asked for the same (`multicast=False`).
"""

import contextlib
import dataclasses
import json
import math
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from ..client import clique_group, slots_needed
from ..netns import LabError, await_listening, package_environment
from ..plan.cost import AGGREGATE, RING, Clique, CostModel
from ..plan.search import plan_schedule
from ..plan.topology import Topology
from ..protocol import ELEMENT_BYTES, INWIRE_PORT, MAX_ELEMENTS_PER_FRAME
from .island import expected_digest

STRATEGIES = ("schedule", "rotation", "global_clique", "global_tree", "host_tree", "host_tree_tuned", "gloo",
              "gloo_tuned", "mpi_ring", "mpi_tree")
ROTATION = "grid2d"
"""The rotating cliques the lab times: the planner's geographic grid, its rows in one round and its columns
in the next (3+3+3 and 3+3+3 for nine islands), each clique summed at its aggregator along its tree."""
TUNED = "_tuned"
"""A strategy over TCP run with `emulator.TCP_TUNED`: its name is the untuned one's with this suffix."""
START_MARGIN_S = 0.3
"""Commands go out this long before a round's common start: every island has its command by then."""
STARTUP_TIMEOUT_S = 30
MAX_WINDOW = 1024


@dataclass(frozen=True)
class Strategy:
    name: str
    rounds: tuple
    """Rounds of (members, root, tree); empty for gloo."""
    predicted_ms: float
    description: str
    order: tuple = ()
    """gloo: the islands in rank order."""

    @property
    def tuned(self):
        """Run over TCP tuned (`emulator.TCP_TUNED`)."""
        return self.name.endswith(TUNED)

    @property
    def max_cliques(self):
        return max((len(cliques) for cliques in self.rounds), default=1)


def scaled_topology(topology, delay_scale, rate_scale):
    """The topology the lab emulates, multicast off (the lab routes none)."""
    return Topology(f"{topology.name} x{delay_scale:g} delay x{rate_scale:g} rate",
                    [dataclasses.replace(city, multicast=False) for city in topology.cities.values()],
                    [dataclasses.replace(link, latency_ms=link.latency_ms * delay_scale,
                                         bandwidth_gbps=link.bandwidth_gbps * rate_scale) for link in topology.links],
                    topology.description, topology.source)


def _best_hub(model, islands):
    hubs = [city for city in model.aggregation_cities]
    if not hubs:
        raise LabError(f"topology {model.topology.name!r} has no aggregation city")
    return min(hubs, key=lambda hub: (model.clique_time_alone(Clique(islands, hub, AGGREGATE)), hub))


def _aggregated_rounds(model, schedule, name):
    """A schedule's rounds as (members, root, tree) per clique; a LabError if a clique is exchanged directly."""
    rounds = []
    for r, cliques in enumerate(schedule.rounds):
        for c, clique in enumerate(cliques):
            if clique.exchange != AGGREGATE:
                raise LabError(f"{name}: clique {c} of round {r} is exchanged directly ({clique.exchange}); the lab "
                               f"measures cliques through aggregators only")
        rounds.append(tuple((c.members, c.aggregator, model.profile(c).tree or {}) for c in cliques))
    return tuple(rounds)


def plan_strategies(topology, islands, vector_bytes, delay_scale, rate_scale, seed=0, names=STRATEGIES):
    """The strategies `names` for the scaled topology, with the cost model's prediction of each."""
    scaled = scaled_topology(topology, delay_scale, rate_scale)
    islands = scaled.resolve_islands(islands)
    flat = CostModel(scaled, islands, vector_bytes, multicast=False)
    treed = CostModel(scaled, islands, vector_bytes, multicast=False, reduce_in_path=True)
    strategies = []
    for name in names:
        base = name.removesuffix(TUNED) if name in (f"host_tree{TUNED}", f"gloo{TUNED}") else name
        tuned_tcp = " tuned: reno, no slow start after idle" if base != name else ""
        if name in ("schedule", "rotation"):
            plan = plan_schedule(scaled, islands, vector_bytes, multicast=False, reduce_in_path=True, seed=seed)
            chosen = plan.best if name == "schedule" else plan.baselines[ROTATION]
            rounds = _aggregated_rounds(plan.cost_model, chosen, name)
            predicted = sum(plan.cost_model.round_time(cliques) for cliques in chosen.rounds)
            what = "the planner's schedule" if name == "schedule" else "rotating cliques (the planner's grid2d)"
            strategies.append(Strategy(name, rounds, predicted,
                                       f"{what}, {len(rounds)} rounds of {'/'.join(str(len(r)) for r in rounds)} "
                                       f"cliques"))
        elif name == "global_clique":
            hub = _best_hub(flat, islands)
            strategies.append(Strategy(name, (((islands, hub, {}),),),
                                       flat.clique_time_alone(Clique(islands, hub, AGGREGATE)),
                                       f"every island in one clique at {hub}"))
        elif name == "global_tree":
            hub = _best_hub(treed, islands)
            clique = Clique(islands, hub, AGGREGATE)
            strategies.append(Strategy(name, (((islands, hub, treed.profile(clique).tree or {}),),),
                                       treed.clique_time_alone(clique),
                                       f"every island in one reduction tree rooted at {hub}"))
        elif base == "host_tree":
            clique = flat.host_tree_clique(islands)
            strategies.append(Strategy(name, (), flat.clique_time_alone(clique),
                                       f"a host-side tree all-reduce over TCP{tuned_tcp} rooted at {clique.members[0]}",
                                       clique.members))
        elif base == "gloo":
            order = tuple(flat.ring_order(islands))
            strategies.append(Strategy(name, (), flat.clique_time_alone(Clique(order, None, RING)),
                                       f"torch.distributed all_reduce (gloo, TCP{tuned_tcp}), ranks in ring order",
                                       order))
        elif name == "mpi_ring":
            order = tuple(flat.ring_order(islands))
            strategies.append(Strategy(name, (), flat.clique_time_alone(Clique(order, None, RING)),
                                       "Open MPI's MPI_Allreduce (mpi4py, TCP), its ring, ranks in ring order", order))
        elif name == "mpi_tree":
            clique = flat.host_tree_clique(islands)
            strategies.append(Strategy(name, (), flat.clique_time_alone(clique),
                                       f"Open MPI's MPI_Allreduce (mpi4py, TCP), reduce and broadcast along a binary "
                                       f"tree rooted at {clique.members[0]}", clique.members))
        else:
            raise LabError(f"unknown strategy {name!r}: choose from {', '.join(STRATEGIES)}")
    return strategies


def _read_line(process, what, timeout_s):
    ready, _, _ = select.select([process.stdout], [], [], timeout_s)
    line = process.stdout.readline() if ready else ""
    if not line:
        raise LabError(f"{what} did not answer within {timeout_s:.0f} s"
                       + (f" (exit status {process.poll()})" if process.poll() is not None else ""))
    return line


class Measurement:
    """Aggregators and islands in the lab's cities, started for `strategies`; a context manager."""

    def __init__(self, lab, islands, vector_bytes, strategies, reps, seed=0, chunk=MAX_ELEMENTS_PER_FRAME,
                 window=None):
        self.lab, self.islands, self.strategies, self.reps, self.seed = lab, tuple(islands), strategies, reps, seed
        self.elements = -(-int(vector_bytes) // ELEMENT_BYTES)
        self.chunk = chunk
        self.window = min(window or MAX_WINDOW, -(-self.elements // chunk))
        self.job = int.from_bytes(os.urandom(3), "big") + 1
        self.next_round = 0
        self.cities = sorted({city for s in strategies for cliques in s.rounds for _, root, tree in cliques
                              for city in (root, *tree.values())})
        self.slots = slots_needed(max((s.max_cliques for s in strategies), default=1), self.window)
        worst_rtt_s = 2e-3 * max(lab.topology.latency_ms(a, b) * lab.delay_scale for a in self.islands
                                 for b in lab.topology.cities)
        serialization_s = 8 * len(self.islands) * self.elements * ELEMENT_BYTES / min(
            link.rate_bps for link in lab.links)
        self.timeout_s = max(1.0, 2 * worst_rtt_s + serialization_s)
        self.deadline_s = 20 * self.timeout_s + 30
        self.services, self.members, self._stack = {}, {}, None

    def __enter__(self):
        self._stack = contextlib.ExitStack()
        try:
            self._start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc):
        self._stack.close()

    def _spawn(self, argv, **options):
        process = subprocess.Popen(argv, env=package_environment(), text=True, **options)

        def stop():
            if process.stdin:
                with contextlib.suppress(OSError):
                    process.stdin.close()
            if process.poll() is None:
                process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

        self._stack.callback(stop)
        return process

    def _start(self):
        lab = self.lab
        for city in self.cities:
            service = self._spawn(lab.python(city, "inwire", "serve", "--listen",
                                             f"{lab.addresses[city]}:{INWIRE_PORT}", "--unicast", "--slots",
                                             str(self.slots), "--max-elements", str(self.chunk),
                                             "--receive-buffer", str(32 << 20), "--unregistered"),
                                  stderr=subprocess.PIPE)
            await_listening(service, f"the aggregator in {city}", STARTUP_TIMEOUT_S)
            self.services[city] = service
        aggregators = json.dumps({city: [lab.addresses[city], INWIRE_PORT] for city in lab.cities})
        for city in self.islands:
            self.members[city] = self._spawn(
                lab.python(city, "inwire.lab.island", city, "--address", lab.addresses[city], "--aggregators",
                           aggregators, "--job", str(self.job), "--chunk", str(self.chunk), "--window",
                           str(self.window), "--timeout", f"{self.timeout_s:.3f}", "--deadline",
                           f"{self.deadline_s:.0f}"),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        for city, process in self.members.items():
            _read_line(process, f"the island in {city}", STARTUP_TIMEOUT_S)

    def _round(self, period_round, cliques, max_cliques):
        """Round `period_round` of a period, its `cliques` started together; its time (s) and the
        retransmissions."""
        round_ = self.next_round
        self.next_round += 1
        start = time.time() + START_MARGIN_S
        waiting = {}
        for c, (members, root, tree) in enumerate(cliques):
            for member in members:
                command = {"job": self.job, "round": round_, "clique": c, "group": clique_group(period_round, c),
                           "members": list(members), "root": root, "tree": tree, "seed": self.seed + round_,
                           "index": self.islands.index(member), "elements": self.elements,
                           "max_cliques": max_cliques, "start": start}
                process = self.members[member]
                process.stdin.write(json.dumps({"sum": command}) + "\n")
                process.stdin.flush()
                waiting[member] = members
        ended, retransmits = start, 0
        for member, members in waiting.items():
            answer = json.loads(_read_line(self.members[member], f"the island in {member}", self.deadline_s + 30))
            if "error" in answer:
                raise LabError(f"the island in {member}: {answer['error']}")
            wanted = expected_digest(self.seed + round_, [self.islands.index(m) for m in members], self.elements)
            if answer["digest"] != wanted:
                raise LabError(f"round {round_}: the island in {member} got a sum that is not its clique's")
            ended = max(ended, answer["ended"])
            retransmits += answer["retransmits"]
        return ended - start, retransmits

    def inwire(self, strategy):
        """Each repetition's time (ms) of one period of `strategy`, and the retransmissions in all."""
        times, retransmits = [], 0
        for _ in range(self.reps):
            total = 0.0
            for period_round, cliques in enumerate(strategy.rounds):
                seconds, resent = self._round(period_round, cliques, strategy.max_cliques)
                total += seconds
                retransmits += resent
            times.append(1e3 * total)
        return times, retransmits

    def host_tree(self, strategy, port=29611):
        """Each repetition's time (ms) of the host-side tree all-reduce among `strategy.order` (root first),
        after one repetition that warms the connections up (gloo's group warms up the same way)."""
        lab, order = self.lab, strategy.order
        parents = host_parents(lab.topology, order)
        children = {city: sum(1 for p in parents.values() if p == city) for city in order}
        period = max(2.0, 4e-3 * strategy.predicted_ms + 1.0)
        start = time.time() + 3.0 + 4e-3 * max(lab.topology.latency_ms(a, b) * lab.delay_scale for a in order
                                                for b in order)
        hosts = []
        for index, city in enumerate(order):
            parent = f"{lab.addresses[parents[city]]}:{port}" if city in parents else ""
            hosts.append(subprocess.Popen(
                lab.python(city, "inwire.lab.hosttree", "--address", lab.addresses[city], "--port", str(port),
                           "--parent", parent, "--children", str(children[city]), "--index", str(index),
                           "--members", str(len(order)), "--elements", str(self.elements), "--reps",
                           str(self.reps + 1), "--start", f"{start:.6f}", "--period", f"{period:.3f}", "--seed",
                           str(self.seed)),
                env=package_environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        reports = self._collect(order, hosts, "host-tree host", start + (self.reps + 1) * period + self.deadline_s)
        return _spans(reports, first=1)

    def _collect(self, cities, processes, what, until):
        """Every process's last JSON line; a LabError naming the first that failed."""
        reports = []
        try:
            for city, process in zip(cities, processes):
                out, err = process.communicate(timeout=max(10.0, until - time.time() + 60))
                if process.returncode != 0:
                    last = (err.strip().splitlines() or ["no output"])[-1]
                    raise LabError(f"the {what} in {city} failed: {last}")
                reports.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        return reports

    def gloo(self, strategy, port=29511):
        """Each repetition's time (ms) of one gloo all_reduce among the islands (ranks in `strategy.order`)."""
        lab, order = self.lab, strategy.order
        margin = max(1.0, 8e-3 * max(lab.topology.latency_ms(a, b) * lab.delay_scale for a in order for b in order))
        environment = package_environment()
        environment["GLOO_SOCKET_IFNAME"] = "city"
        ranks = []
        for rank, city in enumerate(order):
            ranks.append(subprocess.Popen(
                lab.python(city, "inwire.lab.gloo", "--rank", str(rank), "--world", str(len(order)), "--master",
                           f"{lab.addresses[order[0]]}:{port}", "--elements", str(self.elements), "--reps",
                           str(self.reps), "--margin", f"{margin:.3f}", "--seed", str(self.seed),
                           "--timeout", f"{self.deadline_s:.0f}"),
                env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        reports = self._collect(order, ranks, "gloo rank", time.time() + self.deadline_s * (self.reps + 2) + 60)
        return _spans(reports)


    def mpi(self, strategy):
        """Each repetition's time (ms) of one Open MPI all-reduce among the islands (ranks in `strategy.order`),
        its algorithm locked to `strategy`'s (`mpi.ALGORITHMS`). `mpirun` starts in the first rank's city and
        reaches the others through a remote shell that enters their namespaces; ranks talk TCP over the
        cities' own interfaces only, never through shared memory."""
        from .mpi import ALGORITHMS

        lab, order = self.lab, strategy.order
        algorithm = ALGORITHMS[strategy.name.removeprefix("mpi_")]
        margin = max(1.0, 8e-3 * max(lab.topology.latency_ms(a, b) * lab.delay_scale for a in order for b in order))
        with tempfile.TemporaryDirectory(prefix="inwire-mpi-") as directory:
            hosts, agent = os.path.join(directory, "hosts"), os.path.join(directory, "enter-city")
            with open(hosts, "w") as handle:
                handle.writelines(f"{lab.namespaces[city]} slots=1\n" for city in order)
            with open(agent, "w") as handle:
                # mpirun's remote shell: the node is a city's namespace, the rest the command to start there.
                handle.write('#!/bin/sh\nnode="$1"; shift\nexec ip netns exec "$node" /bin/sh -c "$*"\n')
            os.chmod(agent, 0o700)
            parameters = {"plm_rsh_agent": agent, "plm_rsh_no_tree_spawn": "1", "btl": "self,tcp",
                          "btl_tcp_if_include": "city", "oob_tcp_if_include": "city",
                          "coll_tuned_use_dynamic_rules": "1", **algorithm}
            command = lab.command(order[0], "mpirun", "--allow-run-as-root", "--hostfile", hosts, "-np",
                                  str(len(order)), *(item for name, value in parameters.items()
                                                     for item in ("--mca", name, value)),
                                  sys.executable, "-m", "inwire.lab.mpi", "--elements", str(self.elements),
                                  "--reps", str(self.reps), "--margin", f"{margin:.3f}", "--seed", str(self.seed))
            # mpirun stops its daemons in the other cities when it is terminated, not when it is killed.
            mpirun = subprocess.Popen(command, env=package_environment(), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True)
            try:
                out, err = mpirun.communicate(timeout=self.deadline_s * (self.reps + 2) + 60)
            except subprocess.TimeoutExpired:
                mpirun.terminate()
                out, err = mpirun.communicate()
                raise LabError(f"{strategy.name}: mpirun did not finish in time; its last words: "
                               f"{' | '.join(err.strip().splitlines()[-3:]) or 'none'}") from None
        if mpirun.returncode != 0:
            last = (err.strip().splitlines() or ["no output"])[-1]
            raise LabError(f"{strategy.name}: mpirun failed (status {mpirun.returncode}): {last}")
        reports = {}
        for line in out.splitlines():
            with contextlib.suppress(ValueError):
                report = json.loads(line)
                reports[report["rank"]] = report
        if sorted(reports) != list(range(len(order))):
            raise LabError(f"{strategy.name}: {len(reports)} of {len(order)} ranks reported")
        return _spans([reports[rank] for rank in range(len(order))])


def host_parents(topology, members):
    """Each member's parent host in the host-side tree rooted at members[0]: the first member on its
    latency-shortest path to the root (the cost model's rule)."""
    root, wanted, parents = members[0], set(members), {}
    for member in members[1:]:
        path = topology.path(member, root)
        parents[member] = next(city for city in path[1:] if city in wanted)
    return parents


def _spans(reports, first=0):
    """From every process's report of a TCP baseline: each repetition's time (ms) from its common start to
    the last process's end (from repetition `first` on), the latest start, and the largest error."""
    times = [1e3 * (max(r["reps"][k]["ended"] for r in reports) - reports[0]["reps"][k]["start"])
             for k in range(first, len(reports[0]["reps"]))]
    late = max(rep["late_s"] for r in reports for rep in r["reps"])
    return times, late, max(r["max_error"] for r in reports)


def summarize(strategy, times_ms, **extra):
    median = statistics.median(times_ms)
    entry = {"name": strategy.name, "description": strategy.description, "measured_ms": round(median, 3),
             "spread_ms": round(max(times_ms) - min(times_ms), 3), "reps_ms": [round(t, 3) for t in times_ms],
             "predicted_ms": round(strategy.predicted_ms, 3),
             "measured_over_predicted": round(median / strategy.predicted_ms, 4)
             if strategy.predicted_ms and math.isfinite(strategy.predicted_ms) else None}
    entry.update(extra)
    return entry


def ranking(entries, key):
    return [entry["name"] for entry in sorted(entries, key=lambda e: (e[key], e["name"]))]


SEPARATED = 0.05
"""Two predictions closer than this fraction are a tie: the model ranks neither above the other."""


def ranking_disagreements(entries):
    """Pairs the model orders (predictions more than SEPARATED apart) that the measurement orders the other
    way, as (predicted faster, measured faster)."""
    wrong = []
    for i, first in enumerate(entries):
        for second in entries[i + 1:]:
            fast, slow = sorted((first, second), key=lambda e: e["predicted_ms"])
            if slow["predicted_ms"] > fast["predicted_ms"] * (1 + SEPARATED) and \
                    slow["measured_ms"] < fast["measured_ms"]:
                wrong.append((fast["name"], slow["name"]))
    return wrong
