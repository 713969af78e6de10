"""One island of the lab, run in its city's namespace: sums test vectors through inwire on command.

`python -m inwire.lab.island CITY --aggregators JSON ...` reads one JSON command per line on stdin and
answers each with one JSON line on stdout:

- `{"sum": {...}}`: its vector of the round (seeded by `seed` and the island's `index`), summed with the
  clique `members` through the island client (`inwire.client.UdpMember`) as a member of the registered job
  `job` (version 3 frames carrying its `token`; the tables the lab registered at every aggregator of the
  clique's tree hold the route), sent to the aggregator of city `sends_to` and started at the wall-clock time
  `start` (every city shares this machine's clock, so the islands of a clique start together); the answer
  holds the time it ended, a digest of the sums and the retransmissions.
- end of input: the island exits.

Its first line, `{"ready": true, "port": N}`, names the UDP port its socket is bound to: the lab registers
that endpoint as a member of each job.
"""

import argparse
import hashlib
import json
import sys
import time

import numpy as np

from ..client import ClientError, CliqueKey, UdpMember

VALUE_BOUND = 1 << 20
"""Test elements lie in [-VALUE_BOUND, VALUE_BOUND): a sum of up to 2^11 islands stays inside int32."""


def test_vector(seed, index, elements):
    return np.random.default_rng([seed, index]).integers(-VALUE_BOUND, VALUE_BOUND, elements, dtype=np.int32)


def expected_digest(seed, indices, elements):
    total = sum(test_vector(seed, index, elements).astype(np.int64) for index in indices)
    return hashlib.sha256(total.astype(np.int32).tobytes()).hexdigest()


def run_sum(member, city, command):
    members = command["members"]
    vector = test_vector(command["seed"], command["index"], command["elements"])
    # Group 0: the lab routes no multicast, so every aggregator sends each member and child its own copy.
    key = CliqueKey(command["job"], command["round"], command["clique"], 0, len(members), 0, command["max_cliques"],
                    token=command["token"])
    before = member.retransmits
    time.sleep(max(0.0, command["start"] - time.time()))
    began = time.time()
    sums, overflow = member.sum(key, members.index(city), vector, command["sends_to"], None, members)
    ended = time.time()
    return {"began": began, "ended": ended, "digest": hashlib.sha256(sums.tobytes()).hexdigest(),
            "overflow": bool(overflow), "retransmits": member.retransmits - before}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m inwire.lab.island")
    parser.add_argument("city")
    parser.add_argument("--address", required=True, help="the city's IPv4 address")
    parser.add_argument("--aggregators", required=True, help="JSON: city -> [host, port]")
    parser.add_argument("--chunk", type=int, required=True)
    parser.add_argument("--window", type=int, required=True)
    parser.add_argument("--timeout", type=float, required=True, help="the longest retransmission timeout, s")
    parser.add_argument("--deadline", type=float, required=True, help="seconds after which a sum fails")
    args = parser.parse_args(argv)
    aggregators = {city: tuple(address) for city, address in json.loads(args.aggregators).items()}
    member = UdpMember(aggregators, chunk=args.chunk, window=args.window, timeout_s=args.timeout,
                       deadline_s=args.deadline, bind=(args.address, 0))
    print(json.dumps({"ready": True, "port": member.address[1]}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        try:
            answer = run_sum(member, args.city, command["sum"])
        except ClientError as error:
            answer = {"error": str(error)}
        print(json.dumps(answer), flush=True)
    member.close()


if __name__ == "__main__":
    main()
