"""Registered jobs: make a job file, register it at aggregators (inwire serve), leave it, tear it down.

  inwire job new --members HOST:PORT,... --slots N [--group A.B.C.D] > job.json
  inwire job register --aggregator HOST:PORT job.json [--ttl S]
  inwire job leave --aggregator HOST:PORT job.json
  inwire job teardown --aggregator HOST:PORT job.json
  inwire job board --device /dev/ttyUSB1 [job.json ...]

A job file holds the job's id and token (random) and its tables: the addresses its members send from, its
slot quota and its multicast group. Anyone holding the token can send as a member, so the file is written
with mode 0600. A registration lasts --ttl seconds unless it is registered again (islands renew theirs while
they run). Requests are signed with the operator key ($INWIRE_KEY_FILE, else ~/.config/inwire/operator.key),
which the aggregator must share. Each island may register its own job file (the same job, its own socket
as the members): `leave` takes those members out again and leaves the job to the others, until its last
member leaves; `teardown` removes the whole job at once. `board` writes the job tables of a Versa board (its
USB UART, the management port: docs/board.md) so that it holds exactly the jobs given, none to empty them.
"""

import io
import ipaddress
import json
import os
import stat
import sys

from .. import control
from ..control import DEFAULT_TTL_S, ENTRY_FIELDS, MAX_BODY, MAX_TTL_S, RequestError
from ..datagram import ip_int, parse_endpoint
from ..errors import InwireError
from ..inputs import open_regular
from ..jobs import JobLimits
from . import HelpFormatter
from .options import decimal, whole

MAX_JOB_FILE = 4 * MAX_BODY
"""Largest job file read: its entry must fit one control message, pretty-printed it takes more room."""


class JobFileError(InwireError):
    """A job file cannot be read or does not describe a job; the message names the file."""


def add_arguments(parser):
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION",
                                    help="new, register, leave, teardown or board (inwire job ACTION --help for "
                                         "its options)")
    new = actions.add_parser("new", help="print a new job file (random job id and token) to stdout",
                             formatter_class=HelpFormatter,
                             description="Print a new job file (random job id and token) to stdout; redirected to "
                                         "a file, the file gets mode 0600 (it holds the token).")
    new.add_argument("--members", required=True, metavar="HOST:PORT,...",
                     help="comma-separated addresses the job's islands send from (their sockets' own address and "
                          "port)")
    new.add_argument("--slots", required=True, type=whole("--slots", 1, control.MAX_SLOTS),
                     help="slot quota: the job's frames name slots 0 to N - 1, a range of each aggregator's own")
    new.add_argument("--group", default=None, metavar="A.B.C.D",
                     help="multicast group (in 239.0.0.0/8) results go to (default: a unicast copy to each member)")
    for name, summary in (("register", "register a job at aggregators (again: renew it)"),
                          ("leave", "take the job file's members out of the job at aggregators (the job is "
                                    "removed with its last member)"),
                          ("teardown", "tear a job down at aggregators (its slots are freed)")):
        action = actions.add_parser(name, help=summary, description=summary[0].upper() + summary[1:] + ".",
                                    formatter_class=HelpFormatter)
        action.add_argument("job_file", metavar="JOB_FILE", help="job file written by inwire job new")
        action.add_argument("--aggregator", required=True, action="append", metavar="HOST:PORT",
                            help="the aggregator's address (inwire serve --listen); repeat for several")
        if name == "register":
            action.add_argument("--ttl", type=whole("--ttl", 1, MAX_TTL_S), default=DEFAULT_TTL_S, metavar="S",
                                help="seconds the registration lasts unless it is registered again")
        action.add_argument("--key-file", default=None, metavar="PATH",
                            help=f"operator key to sign with (default: ${control.KEY_ENV}, else "
                                 f"~/.config/inwire/operator.key)")
        action.add_argument("--timeout", type=decimal("--timeout", 0.001, 60, unit="seconds"),
                            default=control.DEFAULT_TIMEOUT_S, metavar="S",
                            help=f"seconds to wait for each aggregator's answer ({control.DEFAULT_RETRIES} more "
                                 f"tries follow)")
    board = actions.add_parser("board", formatter_class=HelpFormatter,
                               help="make a Versa board's job tables hold exactly these jobs (over its USB UART)",
                               description="Make a Versa board's job tables hold exactly the jobs of these job "
                                           "files, in table entries 0, 1, ... (none: empty the tables), through "
                                           "its management port, the board's USB UART at 115200 baud 8N1.")
    board.add_argument("job_files", nargs="*", metavar="JOB_FILE", help="job file written by inwire job new")
    board.add_argument("--device", required=True, metavar="PATH",
                       help="the board's serial device (the Versa's FT2232H channel B, e.g. /dev/ttyUSB1)")


def run(args):
    if args.action == "new":
        return _new(args)
    if args.action == "board":
        return _board(args)
    # Everything is checked before the first request goes out.
    aggregators = [parse_endpoint(text, "--aggregator") for text in args.aggregator]
    for text, (_, port) in zip(args.aggregator, aggregators):
        if port == 0:
            raise ValueError(f"--aggregator {text!r}: port 0 is no aggregator's port")
    entry = read_job_file(args.job_file)
    if args.action == "leave" and not entry.members:
        raise ValueError(f"job file {args.job_file}: field members is empty: no member to leave")
    key = control.load_key(args.key_file)
    for (host, port) in aggregators:
        if args.action == "register":
            base = control.register((host, port), entry, key=key, ttl_s=args.ttl, timeout_s=args.timeout)
            print(f"inwire job: job {entry.job} registered at {host}:{port}: its slots are {base} to "
                  f"{base + entry.slots - 1} there; the registration lasts {args.ttl} s unless registered again")
        elif args.action == "leave":
            left, remaining = control.leave((host, port), entry, key=key, timeout_s=args.timeout)
            print(f"inwire job: job {entry.job} at {host}:{port}: {_leave_outcome(left, remaining)}")
        else:
            removed = control.teardown((host, port), entry, key=key, timeout_s=args.timeout)
            print(f"inwire job: job {entry.job} {'torn down' if removed else 'was not registered'} at {host}:{port}")
    return 0


def _leave_outcome(left, remaining):
    members = f"{left} member{'' if left == 1 else 's'}"
    if not left:
        return "none of the job file's members was a member there (left already, or not registered)"
    if not remaining:
        return f"{members} left, the last: the job is removed (its slots are free)"
    return f"{members} left; {remaining} remain{'s' if remaining == 1 else ''}"


def _board(args):
    from inwire_hdl.board_control import BAUD, board_writes
    from inwire_hdl.job_table import control_records

    from ..board_serial import send

    # Every file is read and every job placed before the first byte goes out.
    writes, placed = board_writes([read_job_file(path) for path in args.job_files])
    records = control_records(writes)
    send(args.device, records, BAUD)
    for job, index, base, slots in placed:
        print(f"inwire job: job {job} written to entry {index} of the board's tables: its slots are {base} to "
              f"{base + slots - 1} there")
    print(f"inwire job: {len(writes)} control records sent to {args.device}; the board holds {len(placed)} jobs")
    return 0


def _new(args):
    members = []
    for text in args.members.split(","):
        host, port = parse_endpoint(text.strip(), "--members")
        address = ipaddress.IPv4Address(host)
        if port == 0 or address.is_multicast or address.is_unspecified:
            raise ValueError(f"--members {text.strip()!r}: not a unicast address and port a member sends from")
        members.append((host, port))
    group = 0
    if args.group is not None:
        try:
            group = ip_int(str(ipaddress.IPv4Address(args.group)))
        except ValueError:
            raise ValueError(f"--group {args.group!r} is not an IPv4 address") from None
        if group >> 24 != 239:
            raise ValueError(f"--group {args.group}: not in 239.0.0.0/8, where results' multicast groups are "
                             f"(leave it out for unicast results)")
    if len(members) > JobLimits().members:
        raise ValueError(f"--members: {len(members)} members, more than the {JobLimits().members} an aggregator "
                         f"holds per job")
    entry = control.new_job(members, args.slots, group=group)
    text = json.dumps(control.entry_to_json(entry), indent=2) + "\n"
    try:
        stdout = sys.stdout.fileno()
    except (AttributeError, io.UnsupportedOperation):
        stdout = None  # output captured in memory: no file to protect
    if stdout is not None and stat.S_ISREG(os.fstat(stdout).st_mode):
        os.fchmod(stdout, 0o600)  # the file holds the job's token
    sys.stdout.write(text)
    return 0


def read_job_file(path):
    """The `JobEntry` a job file describes; JobFileError naming the file and the field otherwise."""
    with open_regular(path, "job file", JobFileError, "a file written by inwire job new") as file:
        data = file.read(MAX_JOB_FILE + 1)
    if len(data) > MAX_JOB_FILE:
        raise JobFileError(f"job file {path}: more than {MAX_JOB_FILE} bytes, not a job file of inwire job new")
    try:
        body = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise JobFileError(f"job file {path}: not JSON ({str(error).splitlines()[0]})") from None
    if not isinstance(body, dict):
        raise JobFileError(f"job file {path}: not a JSON object, as inwire job new writes")
    unknown = sorted(set(body) - set(ENTRY_FIELDS))
    if unknown:
        raise JobFileError(f"job file {path}: field {unknown[0]} is not one a job file has")
    try:
        return control.entry_from_json(body)
    except RequestError as error:
        raise JobFileError(f"job file {path}: {error}") from None
