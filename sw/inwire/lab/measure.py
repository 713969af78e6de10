"""The synchronization strategies timed on the emulated network, beside the cost model's predictions.

Every strategy sums the same vector of every island once (`vector_bytes` of int32 through inwire, as many
float32 through gloo), several times, each repetition started at one wall-clock instant in every city:

- `schedule`: the planner's schedule for the scaled topology (one period: its rounds one after another,
  each started when the last has ended everywhere, as the cost model times a period), software aggregators
  (`inwire serve`) in its cities, chained along its reduction trees (of any depth: planned with the trees in
  the aggregators' tables, `tree_tables`, as `inwire schedule --tree-tables` plans them);
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

Every round of an inwire strategy is a registered job of its own, as training runs them: the aggregators
take registered jobs only, authenticated with an operator key the lab makes for its run (a file of mode
0600 in a directory of its own, removed at the end). Before a round's islands send, the lab gives the job a
random id and token (`control.new_job`) and registers at every aggregator of the round's trees its own
entry (`plan.tables.schedule_routes`: the islands that send to it, and per clique its level, parent and
children), from inside that aggregator's city (`WanLab.inside`: the control exchange never crosses an
emulated link); it tears the job down once every island has its sum. The islands send version 3 frames
carrying the token and no route: each aggregator sends one partial to its parent, and the result comes
back down the tree, one copy to each child aggregator and to each of its own members.

The lab routes no multicast, so every aggregator sends each member its copy (`inwire serve --unicast`), and
the model is asked for the same (`multicast=False`).
"""

import contextlib
import dataclasses
import json
import math
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from ..client import KERNEL_BYTES_PER_DATAGRAM, job_slots
from ..control import MAX_TTL_S, load_key, new_job, register, teardown
from ..datagram import ip_int
from ..jobs import FLAT
from ..netns import LabError, await_listening, package_environment
from ..plan.cost import AGGREGATE, RING, Clique, CostModel
from ..plan.schedule_file import member_paths
from ..plan.search import plan_schedule
from ..plan.tables import schedule_routes
from ..plan.topology import Topology
from ..protocol import ELEMENT_BYTES, ETHERNET_BYTES, INWIRE_PORT, MAX_ELEMENTS_PER_FRAME, Opcode, frame_bytes
from .emulator import LINK_OVERHEAD_BYTES, MIN_QUEUE_BYTES
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
MPIRUN_ATTEMPTS = 2
MIN_RECEIVE_BUFFER = 32 << 20
"""The least receive buffer of an aggregator in the lab (`inwire serve --receive-buffer`)."""


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


QUEUE_MARGIN = 2
"""Times what every island can have in flight at once, the queue of each link direction (`queue_bytes_for`)."""


def queue_bytes_for(islands, vector_bytes, window=None, chunk=MAX_ELEMENTS_PER_FRAME):
    """The queue of each emulated link direction for `islands` summing `vector_bytes` each in chunks of `chunk`
    elements, `window` chunks in flight per island (default: the lab's, MAX_WINDOW or the whole vector): every
    island's window of full frames at once, with their link overhead, QUEUE_MARGIN times, at least
    `emulator.MIN_QUEUE_BYTES`. An island sends its whole window without waiting, and the busiest link of a
    clique summed at one city carries every island's contributions (or every member's copy of the result)
    together; a queue that overflows drops frames that the islands then retransmit, a loss no strategy made.
    The margin covers results, partials and contributions of several cliques meeting on one link."""
    chunks = math.ceil(math.ceil(int(vector_bytes) / ELEMENT_BYTES) / chunk)
    in_flight = min(window or MAX_WINDOW, chunks)
    frame = frame_bytes(chunk, Opcode.RESULT) - ETHERNET_BYTES + LINK_OVERHEAD_BYTES
    return max(MIN_QUEUE_BYTES, QUEUE_MARGIN * len(islands) * in_flight * frame)


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
    # The lab registers each round's trees in the aggregators' tables: no depth cap, as the model is told.
    treed = CostModel(scaled, islands, vector_bytes, multicast=False, reduce_in_path=True, tree_tables=True)
    strategies = []
    for name in names:
        base = name.removesuffix(TUNED) if name in (f"host_tree{TUNED}", f"gloo{TUNED}") else name
        tuned_tcp = " tuned: reno, no slow start after idle" if base != name else ""
        if name in ("schedule", "rotation"):
            plan = plan_schedule(scaled, islands, vector_bytes, multicast=False, reduce_in_path=True, seed=seed,
                                 tree_tables=True)
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
        elif base in ("host_tree", "mpi_tree"):
            clique = flat.host_tree_clique(islands)
            what = (f"a host-side tree all-reduce over TCP{tuned_tcp}" if base == "host_tree"
                    else "Open MPI's MPI_Allreduce (mpi4py, TCP), reduce and broadcast along a binary tree")
            strategies.append(Strategy(name, (), flat.clique_time_alone(clique),
                                       f"{what} rooted at {clique.members[0]}", clique.members))
        elif base in ("gloo", "mpi_ring"):
            order = tuple(flat.ring_order(islands))
            what = (f"torch.distributed all_reduce (gloo, TCP{tuned_tcp})" if base == "gloo"
                    else "Open MPI's MPI_Allreduce (mpi4py, TCP), its ring")
            strategies.append(Strategy(name, (), flat.clique_time_alone(Clique(order, None, RING)),
                                       f"{what}, ranks in ring order", order))
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
        self.next_round = 0
        self.cities = sorted({city for s in strategies for cliques in s.rounds for _, root, tree in cliques
                              for city in (root, *tree.values())})
        # One job is registered at a time (a round's), so each aggregator holds one job's quota.
        self.slots = job_slots(max((s.max_cliques for s in strategies), default=1), self.window,
                               max((len(members) for s in strategies for cliques in s.rounds
                                    for members, _, _ in cliques), default=1))
        worst_rtt_s = 2e-3 * max(lab.topology.latency_ms(a, b) * lab.delay_scale for a in self.islands
                                 for b in lab.topology.cities)
        serialization_s = 8 * len(self.islands) * self.elements * ELEMENT_BYTES / min(
            link.rate_bps for link in lab.links)
        self.timeout_s = max(1.0, 2 * worst_rtt_s + serialization_s)
        self.deadline_s = 20 * self.timeout_s + 30
        self.mpirun_reruns = {}
        """Strategy name -> the mpiruns of `mpi` stopped at their deadline and run again."""
        # An aggregator may take every island's window at once (a clique summed at its city); the kernel
        # charges each datagram KERNEL_BYTES_PER_DATAGRAM beyond its payload.
        self.receive_buffer = max(MIN_RECEIVE_BUFFER, QUEUE_MARGIN * len(self.islands) * self.window * (
            frame_bytes(chunk, Opcode.PARTIAL) + KERNEL_BYTES_PER_DATAGRAM))
        self.services, self.members, self.ports, self._stack = {}, {}, {}, None
        self.key = self.key_file = None

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
        directory = tempfile.mkdtemp(prefix="inwire-lab-")
        self._stack.callback(shutil.rmtree, directory, True)
        self.key_file = f"{directory}/operator.key"
        self.key = load_key(self.key_file)  # made with mode 0600, in a directory of mode 0700
        for city in self.cities:
            service = self._spawn(lab.python(city, "inwire", "serve", "--listen",
                                             f"{lab.addresses[city]}:{INWIRE_PORT}", "--unicast", "--slots",
                                             str(self.slots), "--max-elements", str(self.chunk),
                                             "--receive-buffer", str(self.receive_buffer), "--key-file",
                                             self.key_file),
                                  stderr=subprocess.PIPE)
            await_listening(service, f"the aggregator in {city}", STARTUP_TIMEOUT_S)
            self.services[city] = service
        aggregators = json.dumps({city: [lab.addresses[city], INWIRE_PORT] for city in lab.cities})
        for city in self.islands:
            self.members[city] = self._spawn(
                lab.python(city, "inwire.lab.island", city, "--address", lab.addresses[city], "--aggregators",
                           aggregators, "--chunk", str(self.chunk), "--window",
                           str(self.window), "--timeout", f"{self.timeout_s:.3f}", "--deadline",
                           f"{self.deadline_s:.0f}"),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        for city, process in self.members.items():
            self.ports[city] = json.loads(_read_line(process, f"the island in {city}", STARTUP_TIMEOUT_S))["port"]

    def job_entries(self, cliques):
        """A fresh job (random id and token) for one round's `cliques` and city -> the entry its aggregator
        holds: the islands that send to it and, per clique, its route in the clique's tree."""
        lab = self.lab
        islands = {city: (ip_int(lab.addresses[city]), port) for city, port in self.ports.items()}
        aggregators = {city: (ip_int(lab.addresses[city]), INWIRE_PORT) for city in self.cities}
        routes, members = schedule_routes([[(members, root) for members, root, _ in cliques]],
                                          [[tree or None for _, _, tree in cliques]], islands, aggregators)
        job = new_job(islands.values(), self.slots)
        return job, {city: dataclasses.replace(job, members=frozenset(members.get(city, ())),
                                               routes={c: route for c, route in routes[city].items() if route != FLAT})
                     for city in routes}

    @contextlib.contextmanager
    def registered(self, entries):
        """Each city's entry registered at its aggregator for the body, from inside the city's namespace (the
        services listen on the cities' own addresses); the job torn down everywhere after."""
        ttl_s = min(MAX_TTL_S, math.ceil(2 * self.deadline_s + 60))
        done = []
        try:
            for city, entry in entries.items():
                with self.lab.inside(city):
                    register((self.lab.addresses[city], INWIRE_PORT), entry, self.key, ttl_s)
                done.append(city)
            yield
        finally:
            for city in done:
                with self.lab.inside(city):
                    teardown((self.lab.addresses[city], INWIRE_PORT), entries[city], self.key)

    def _round(self, cliques, max_cliques):
        """One round of a period, its `cliques` started together as one registered job; its time (s), the
        retransmissions and {(from, to): bytes} each emulated link direction carried meanwhile (the
        registration is sent within each city: it crosses no link)."""
        job, entries = self.job_entries(cliques)
        with self.registered(entries):
            before = self.lab.link_bytes()
            seconds, retransmits = self._sum_round(job, cliques, max_cliques)
            after = self.lab.link_bytes()
        return seconds, retransmits, {direction: after[direction] - before[direction] for direction in after}

    def _sum_round(self, job, cliques, max_cliques):
        round_ = self.next_round
        self.next_round += 1
        start = time.time() + START_MARGIN_S
        waiting = {}
        for c, (members, root, tree) in enumerate(cliques):
            paths = member_paths(members, root, tree)
            for member in members:
                command = {"job": job.job, "token": job.token, "round": round_, "clique": c,
                           "members": list(members), "sends_to": paths[member][0], "seed": self.seed + round_,
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
        """Each repetition's time (ms) of one period of `strategy`, the retransmissions in all, each
        repetition's bytes on every link direction ({(from, to): bytes}) and what they should be
        (`once_per_link_bytes` of the period)."""
        times, retransmits, carried = [], 0, []
        for _ in range(self.reps):
            total, period = 0.0, {}
            for cliques in strategy.rounds:
                seconds, resent, link_bytes = self._round(cliques, strategy.max_cliques)
                total += seconds
                retransmits += resent
                period = _added(period, link_bytes)
            times.append(1e3 * total)
            carried.append(period)
        bound = {}
        for cliques in strategy.rounds:
            bound = _added(bound, once_per_link_bytes(self.lab.topology, cliques, self.elements, self.chunk))
        return times, retransmits, carried, bound

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
        margin = self._start_margin_s(order)
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

    def _start_margin_s(self, order):
        """How far ahead rank 0 of a TCP baseline names each repetition's common start: the time for its
        announcement to reach every rank (8 one-way delays of the longest path among them), at least 1 s."""
        lab = self.lab
        return max(1.0, 8e-3 * max(lab.topology.latency_ms(a, b) * lab.delay_scale for a in order for b in order))

    def mpirun_timeout_s(self):
        """How long one mpirun of `reps` all-reduces may take before it is stopped."""
        return self.deadline_s * (self.reps + 2) + 60

    def mpi(self, strategy):
        """Each repetition's time (ms) of one Open MPI all-reduce among the islands (ranks in `strategy.order`),
        its algorithm locked to `strategy`'s (`mpi.ALGORITHMS`). `mpirun` starts in the first rank's city and
        reaches the others through a remote shell that enters their namespaces; ranks talk TCP over the
        cities' own interfaces only, never through shared memory. An mpirun that does not finish in time (seen
        once in about twenty runs on a loaded machine) is stopped and run again, once; `mpirun_reruns` counts
        those per strategy, and the report carries the count."""
        from .mpi import ALGORITHMS

        lab, order = self.lab, strategy.order
        algorithm = ALGORITHMS[strategy.name.removeprefix("mpi_")]
        margin = self._start_margin_s(order)
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
            for attempt in range(MPIRUN_ATTEMPTS):
                # mpirun stops its daemons in the other cities when it is terminated, not when it is killed.
                mpirun = subprocess.Popen(command, env=package_environment(), stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True)
                try:
                    out, err = mpirun.communicate(timeout=self.mpirun_timeout_s())
                    break
                except subprocess.TimeoutExpired:
                    mpirun.terminate()
                    out, err = mpirun.communicate()
                    if attempt + 1 == MPIRUN_ATTEMPTS:
                        raise LabError(f"{strategy.name}: mpirun did not finish in time, {MPIRUN_ATTEMPTS} times; "
                                       f"its last words: {' | '.join(err.strip().splitlines()[-3:]) or 'none'}"
                                       ) from None
                    self.mpirun_reruns[strategy.name] = self.mpirun_reruns.get(strategy.name, 0) + 1
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


def once_per_link_bytes(topology, cliques, elements, chunk):
    """{(from, to): IP bytes} that one round of registered `cliques` (members, root, tree) puts on each link
    direction when every frame crosses each link once: each member's contribution to the aggregator it sends
    to, each tree aggregator's partial to its parent, and the result from each aggregator to each of its own
    members and to each child aggregator, along the lab's routes (the topology's latency-shortest paths).
    Every chunk counts with what its packet must carry: IPv4, UDP and inwire headers, the status trailer of
    a partial or result."""
    counts = [min(chunk, elements - first) for first in range(0, elements, chunk)]
    vector = {opcode: sum(frame_bytes(count, opcode) - ETHERNET_BYTES for count in counts)
              for opcode in (Opcode.CONTRIBUTION, Opcode.PARTIAL, Opcode.RESULT)}
    bound = {}

    def send(source, destination, opcode):
        path = topology.path(source, destination)
        for hop in zip(path, path[1:]):
            bound[hop] = bound.get(hop, 0) + vector[opcode]

    for members, root, tree in cliques:
        paths = member_paths(members, root, tree)
        parents = {}
        for member in members:
            send(member, paths[member][0], Opcode.CONTRIBUTION)
            send(paths[member][0], member, Opcode.RESULT)
            parents.update(zip(paths[member], paths[member][1:]))
        for city, parent in parents.items():
            send(city, parent, Opcode.PARTIAL)
            send(parent, city, Opcode.RESULT)
    return bound


def _added(totals, more):
    return {key: totals.get(key, 0) + more.get(key, 0) for key in {*totals, *more}}


def link_report(directions, carried, bound):
    """The JSON report of the bytes on every link direction (`directions`, (from, to)) in each repetition
    (`carried`) against `bound` (`once_per_link_bytes`): the ratio of all bytes to the bound (median over the
    repetitions) and the directions that carried more than their bound in some repetition (a frame crossed
    a link twice: a result sent down twice, a retransmission)."""
    def named(counts):
        return {f"{a}->{b}": counts.get((a, b), 0) for a, b in directions}

    total_bound = sum(bound.values())
    return {"link_bytes_bound": named(bound), "link_bytes": [named(period) for period in carried],
            "link_bytes_over_bound": round(statistics.median(sum(period.values()) for period in carried)
                                           / total_bound, 4) if total_bound else None,
            "links_over_bound": [f"{a}->{b}" for a, b in directions
                                 if any(period.get((a, b), 0) > bound.get((a, b), 0) for period in carried)]}


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
