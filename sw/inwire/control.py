"""The control plane of registered jobs: operators install a job's tables (`jobs.JobEntry`) at an aggregator.

A control message is one UDP datagram to the aggregator's own port: b"IWCP", a 32-byte HMAC-SHA256 tag over
b"IWCP" + body with the operator key, and the body, UTF-8 JSON of at most 16 KiB. "IWCP" is no data header
(its first byte is no protocol version), so `inwire serve` takes these datagrams aside before its data plane
decides.

A request: {"op": "register" | "leave" | "teardown", "job": int, "nonce": 16 hex digits, "issued_ms": unix
ms, and for register "ttl_s", "token" (16 hex digits), "slots", "members" (["a.b.c.d:port", ...]), "group"
("239.x.y.z" or null) and "routes" ({"<clique>": {"level": int, "parent": "a.b.c.d:port" or null,
"children": {"a.b.c.d:port": bitmap}}}); for leave "members" (the ones that leave)}. The reply (b"IWCP" +
tag + JSON) echoes the nonce: {"ok": true, "job", "base", "expires_in_s"} (teardown: "removed" instead of
"base"; leave: "left", "remaining" and "removed"), or {"ok": false, "error": one line}.

Each island may register its own socket as a member of one job (registrations merge members), so an island
that is done leaves (its members are removed, the job stays for the others) and the job is removed when its
last member leaves; teardown removes the whole job at once, for the operator.

Whoever lacks the key learns nothing from the control port: a datagram whose tag does not verify, that is
stale (issued more than `FRESH_S` off the aggregator's clock), replayed (a nonce seen within that window) or
that is not a JSON object with a nonce and issue time gets no reply at all, only a count (`control_refused`).
An authenticated request that the aggregator refuses (a field out of range, a clash with a registered job)
gets a one-line error back, to its source alone; no reply is larger than `MAX_REPLY` bytes.

Registrations expire `ttl_s` after they were made (at most `MAX_TTL_S`) unless renewed by registering again
(`JobLease` does so); an expired job is removed and its slots are free for others.
"""

import contextlib
import hashlib
import hmac
import ipaddress
import json
import os
import re
import secrets
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from .datagram import Address, Payload, ip_int, ip_str, parse_endpoint
from .errors import InwireError
from .inputs import open_regular
from .jobs import JOB_BITS, TOKEN_BITS, CliqueRoute, Endpoint, JobEntry, JobTableError

MAGIC = b"IWCP"
TAG_BYTES = hashlib.sha256().digest_size
MAX_BODY = 16 << 10
"""Largest JSON body of a control message, in bytes."""
MAX_MESSAGE = len(MAGIC) + TAG_BYTES + MAX_BODY
MAX_REPLY = 512
"""Largest reply: an aggregator never answers with more than this (errors are cut to fit)."""
KEY_BYTES = 32
FRESH_S = 30
"""How far a request's issued_ms may lie from the aggregator's clock."""
DEFAULT_TTL_S = 60
MAX_TTL_S = 3600
NONCES = 4096
"""Nonces an aggregator remembers (each for 2 x FRESH_S): more requests than this within that time are
refused, so the replay cache stays bounded."""
MAX_SLOTS = 1 << 16
KEY_ENV = "INWIRE_KEY_FILE"
DEFAULT_TIMEOUT_S = 2.0
DEFAULT_RETRIES = 3
CONTROL_COUNTERS = ("control_refused", "control_errors", "jobs_registered", "jobs_renewed", "jobs_torn_down",
                    "jobs_expired", "members_left", "jobs_left")
"""Counters of the control plane: datagrams given no reply (unauthenticated, stale, replayed, malformed),
authenticated requests answered with an error, jobs installed, registrations renewed, jobs torn down, jobs
removed when their registration expired, members removed by a leave, jobs removed when their last member
left."""
_HEX16 = re.compile(r"[0-9a-f]{16}")
_PORT = re.compile(r"[1-9][0-9]{0,4}")


class ControlError(InwireError):
    """A registration did not happen; the message is one line (the aggregator's, or why it did not answer)."""


class KeyFileError(ControlError):
    """The operator key cannot be read or is not a key."""


class RequestError(ControlError):
    """An authenticated request the aggregator refuses; the message is its one-line reply."""


class Refused(ControlError):
    """A datagram that gets no reply at all; the message says why (for tests and logs, never sent)."""


# ---- the operator key


def key_path() -> Path:
    """Where the operator key is: $INWIRE_KEY_FILE, else ~/.config/inwire/operator.key."""
    configured = os.environ.get(KEY_ENV)
    return Path(configured) if configured else Path.home() / ".config" / "inwire" / "operator.key"


def load_key(path: str | os.PathLike[str] | None = None) -> bytes:
    """The operator key at `path` (default: `key_path()`); a missing key is made (32 random bytes, mode 0600),
    atomically, so that two processes starting together end up with the same key."""
    path = Path(path) if path is not None else key_path()
    if not path.exists():
        _create_key(path)
    # a regular file, read only as far as a key goes: a FIFO or /dev/zero named by mistake cannot hang or fill memory
    with open_regular(path, "operator key", KeyFileError, f"a file of {KEY_BYTES} random bytes") as file:
        try:
            key = file.read(KEY_BYTES + 1)
        except OSError as error:
            raise KeyFileError(f"operator key {path}: cannot read it ({error.strerror})") from None
    if len(key) != KEY_BYTES:
        size = f"more than {KEY_BYTES}" if len(key) > KEY_BYTES else str(len(key))
        raise KeyFileError(f"operator key {path}: {size} bytes, not the {KEY_BYTES} of a key (make one with head -c "
                           f"{KEY_BYTES} /dev/urandom > {path}; chmod 600 {path})")
    return key


def _create_key(path: Path) -> None:
    """Write a new key to a file of its own, then link it into place: the key appears whole or not at all, and
    a key someone else made first wins."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        scratch = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        descriptor = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(descriptor, "wb") as file:
                file.write(secrets.token_bytes(KEY_BYTES))
                file.flush()
                os.fsync(file.fileno())
            with contextlib.suppress(FileExistsError):
                os.link(scratch, path)
        finally:
            scratch.unlink()
    except OSError as error:
        raise KeyFileError(f"operator key {path}: it does not exist and cannot be made ({error.strerror}); name "
                           f"another key file (--key-file, or ${KEY_ENV})") from None


def _key(key: bytes | None) -> bytes:
    if key is None:
        return load_key()
    if len(key) != KEY_BYTES:
        raise KeyFileError(f"operator key: {len(key)} bytes, not the {KEY_BYTES} of a key")
    return key


# ---- messages


def _tag(key: bytes, body: bytes) -> bytes:
    return hmac.new(key, MAGIC + body, hashlib.sha256).digest()


def encode(body: Mapping[str, object], key: bytes) -> bytes:
    """The control message carrying `body`, tagged with `key`."""
    text = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
    if len(text) > MAX_BODY:
        raise ControlError(f"control message of {len(text)} bytes, more than the {MAX_BODY} a message holds "
                           f"(too many members or routes for one registration)")
    return MAGIC + _tag(key, text) + text


def decode(message: bytes, key: bytes) -> dict[str, object]:
    """The JSON object a control message carries, once its tag verifies; Refused otherwise."""
    if len(message) > MAX_MESSAGE:
        raise Refused(f"{len(message)} bytes, more than the {MAX_MESSAGE} of a control message")
    if len(message) < len(MAGIC) + TAG_BYTES or message[:len(MAGIC)] != MAGIC:
        raise Refused("not a control message")
    tag, body = message[len(MAGIC):len(MAGIC) + TAG_BYTES], message[len(MAGIC) + TAG_BYTES:]
    if not hmac.compare_digest(tag, _tag(key, body)):
        raise Refused("the tag does not verify with the operator key")
    try:
        decoded = json.loads(body.decode())
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise Refused("the body is not UTF-8 JSON") from None
    if not isinstance(decoded, dict):
        raise Refused("the body is not a JSON object")
    return decoded


def is_control(payload: Payload) -> bool:
    """Whether a datagram to the aggregator's port is a control message (rather than a data frame)."""
    return payload[:len(MAGIC)] == MAGIC


# ---- JSON <-> JobEntry


def _show(endpoint: Endpoint) -> str:
    return f"{ip_str(endpoint[0])}:{endpoint[1]}"


def _field(body: Mapping[str, object], name: str, where: str = "") -> object:
    if name not in body:
        raise RequestError(f"field {where}{name} is missing")
    return body[name]


def _integer(value: object, name: str, low: int, high: int) -> int:
    if type(value) is not int:
        raise RequestError(f"field {name}: {_brief(value)} is not an integer")
    if not low <= value <= high:
        raise RequestError(f"field {name}: {value} is outside [{low}, {high}]")
    return value


def _hex64(value: object, name: str) -> int:
    if not isinstance(value, str) or not _HEX16.fullmatch(value):
        raise RequestError(f"field {name}: {_brief(value)} is not 16 lowercase hex digits")
    return int(value, 16)


def _address(value: object, name: str) -> int:
    if not isinstance(value, str):
        raise RequestError(f"field {name}: {_brief(value)} is not an IPv4 address a.b.c.d")
    try:
        return int(ipaddress.IPv4Address(value))
    except ValueError:
        raise RequestError(f"field {name}: {_brief(value)} is not an IPv4 address a.b.c.d") from None


def _endpoint(value: object, name: str) -> Endpoint:
    host, _, port = value.rpartition(":") if isinstance(value, str) else ("", "", "")
    if not host or not _PORT.fullmatch(port) or int(port) > 0xFFFF:
        raise RequestError(f"field {name}: {_brief(value)} is not a.b.c.d:port")
    return _address(host, name), int(port)


def _brief(value: object) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_keys(body: Mapping[str, object], allowed: Iterable[str], where: str = "") -> None:
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise RequestError(f"field {where}{unknown[0]} is not one a request has")


def entry_to_json(entry: JobEntry) -> dict[str, object]:
    """The register request's fields describing `entry` (its token as 16 hex digits, addresses as a.b.c.d:port)."""
    return {
        "job": entry.job,
        "token": f"{entry.token:016x}",
        "slots": entry.slots,
        "members": sorted(_show(member) for member in entry.members),
        "group": ip_str(entry.group) if entry.group else None,
        "routes": {str(clique): {"level": route.level,
                                 "parent": None if route.parent is None else _show(route.parent),
                                 "children": {_show(child): bitmap for child, bitmap in route.children.items()}}
                   for clique, route in sorted(entry.routes.items())},
    }


ENTRY_FIELDS = ("job", "token", "slots", "members", "group", "routes")
"""The fields of a register request that describe its job (`entry_to_json`): a job file's."""
_ROUTE_FIELDS = ("level", "parent", "children")


def _members(members: object) -> frozenset[Endpoint]:
    """The endpoints of a request's "members"."""
    if not isinstance(members, list):
        raise RequestError(f"field members: {_brief(members)} is not a list of a.b.c.d:port")
    return frozenset(_endpoint(member, f"members[{index}]") for index, member in enumerate(members))


def entry_from_json(body: Mapping[str, object]) -> JobEntry:
    """The `JobEntry` that a register request's (or a job file's) fields describe; RequestError naming the
    field otherwise."""
    job = _integer(_field(body, "job"), "job", 1, (1 << JOB_BITS) - 1)
    token = _hex64(_field(body, "token"), "token")
    slots = _integer(_field(body, "slots"), "slots", 1, MAX_SLOTS)
    endpoints = _members(_field(body, "members"))
    group = body.get("group")
    group_address = 0 if group is None else _address(group, "group")
    routes_json = body.get("routes") or {}
    if not isinstance(routes_json, dict):
        raise RequestError(f"field routes: {_brief(routes_json)} is not an object of clique -> route")
    routes = {}
    for clique_text, route in routes_json.items():
        where = f"routes.{clique_text}"
        if not re.fullmatch(r"0|[1-9][0-9]{0,4}", clique_text):
            raise RequestError(f"field {where}: the clique {clique_text!r} is not a number")
        if not isinstance(route, dict):
            raise RequestError(f"field {where}: {_brief(route)} is not an object with level, parent, children")
        _check_keys(route, _ROUTE_FIELDS, where + ".")
        level = _integer(route.get("level", 0), where + ".level", 0, (1 << 64) - 1)
        parent = route.get("parent")
        children = route.get("children") or {}
        if not isinstance(children, dict):
            raise RequestError(f"field {where}.children: {_brief(children)} is not an object of "
                               f"a.b.c.d:port -> bitmap")
        routes[int(clique_text)] = CliqueRoute(
            level=level,
            parent=None if parent is None else _endpoint(parent, where + ".parent"),
            children={_endpoint(child, f"{where}.children"): _integer(bitmap, f"{where}.children.{child}", 0,
                                                                       (1 << 64) - 1)
                      for child, bitmap in children.items()})
    try:
        return JobEntry(job=job, token=token, slots=slots, members=endpoints, group=group_address, routes=routes)
    except JobTableError as error:
        raise RequestError(str(error)) from None


# ---- the aggregator's side


def _reply(key: bytes, body: dict[str, object]) -> bytes:
    message = encode(body, key)
    if len(message) > MAX_REPLY and "error" in body:
        spare = len(message) - MAX_REPLY + 3
        message = encode({**body, "error": str(body["error"])[:-spare] + "..."}, key)
    return message


class ControlPlane:
    """The control port of one aggregator: `handle(payload, peer, now_s)` takes a control datagram and returns
    the reply to send to `peer` (None: no reply); `expire(now_s)` removes the jobs whose registration ran out.
    `install(entry) -> base`, `remove(job) -> bool` and `leave(job, members) -> (left, remaining)` write the
    aggregator's job tables (its engine's: `model.Aggregator`'s methods of those names). `now_s` is unix time
    in seconds (request issue times are unix milliseconds)."""

    def __init__(self, install: Callable[[JobEntry], int], remove: Callable[[int], bool],
                 leave: Callable[[int, frozenset[Endpoint]], tuple[int, int]], key: bytes | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        self.key = _key(key)
        self.install = install
        self.remove = remove
        self.leave = leave
        self.log = log or (lambda line: None)
        self.expires: dict[int, float] = {}
        """job -> when its registration runs out (unix seconds)."""
        self.counters = dict.fromkeys(CONTROL_COUNTERS, 0)
        self._nonces: OrderedDict[str, float] = OrderedDict()
        """nonce -> when it may be forgotten (it is stale by then), oldest first."""

    def handle(self, payload: Payload, peer: Address, now_s: float) -> bytes | None:
        try:
            request = self._authentic(bytes(payload), now_s)
        except Refused:
            self.counters["control_refused"] += 1
            return None
        nonce = request["nonce"]
        try:
            body = self._perform(request, peer, now_s)
        except (InwireError, ValueError) as error:  # a refusal of the request or of the tables: one line back
            self.counters["control_errors"] += 1
            return _reply(self.key, {"ok": False, "nonce": nonce, "error": str(error).splitlines()[0]})
        return _reply(self.key, {"ok": True, "nonce": nonce, **body})

    def _authentic(self, payload: bytes, now_s: float) -> dict[str, object]:
        """The request, if it is authentic, fresh and new."""
        request = decode(payload, self.key)
        nonce, issued_ms = request.get("nonce"), request.get("issued_ms")
        if not isinstance(nonce, str) or not _HEX16.fullmatch(nonce) or type(issued_ms) is not int:
            raise Refused("no nonce or issue time")
        if abs(issued_ms / 1000 - now_s) > FRESH_S:
            raise Refused(f"issued {issued_ms / 1000 - now_s:+.0f} s off this aggregator's clock")
        while self._nonces and next(iter(self._nonces.values())) < now_s:
            self._nonces.popitem(last=False)
        if nonce in self._nonces:
            raise Refused("a replay: the nonce was seen")
        if len(self._nonces) >= NONCES:
            raise Refused(f"more than {NONCES} requests within {2 * FRESH_S} s")
        self._nonces[nonce] = now_s + 2 * FRESH_S
        return request

    def _perform(self, request: dict[str, object], peer: Address, now_s: float) -> dict[str, object]:
        op = _field(request, "op")
        if op == "teardown":
            _check_keys(request, ("op", "job", "nonce", "issued_ms", "ttl_s"))
            job = _integer(_field(request, "job"), "job", 1, (1 << JOB_BITS) - 1)
            removed = self.remove(job)
            self.expires.pop(job, None)
            if removed:
                self.counters["jobs_torn_down"] += 1
                self.log(f"inwire serve: job {job} torn down by {peer[0]}:{peer[1]}")
            return {"job": job, "removed": removed}
        if op == "leave":
            return self._leave(request, peer)
        if op != "register":
            raise RequestError(f"field op: {_brief(op)} is none of \"register\", \"leave\" and \"teardown\"")
        _check_keys(request, ("op", "nonce", "issued_ms", "ttl_s", *ENTRY_FIELDS))
        ttl_s = _integer(request.get("ttl_s", DEFAULT_TTL_S), "ttl_s", 1, MAX_TTL_S)
        entry = entry_from_json(request)
        base = self.install(entry)
        renewed = entry.job in self.expires
        self.expires[entry.job] = now_s + ttl_s
        if renewed:
            self.counters["jobs_renewed"] += 1
        else:
            self.counters["jobs_registered"] += 1
            members = f"{len(entry.members)} member{'' if len(entry.members) == 1 else 's'}"
            self.log(f"inwire serve: job {entry.job} registered by {peer[0]}:{peer[1]}: slots {base} to "
                     f"{base + entry.slots - 1}, {members}, expires in {ttl_s} s unless renewed")
        return {"job": entry.job, "base": base, "expires_in_s": ttl_s}

    def _leave(self, request: dict[str, object], peer: Address) -> dict[str, object]:
        """Members leave a job; the job is removed with its last member (and its registration forgotten)."""
        _check_keys(request, ("op", "job", "members", "nonce", "issued_ms"))
        job = _integer(_field(request, "job"), "job", 1, (1 << JOB_BITS) - 1)
        members = _members(_field(request, "members"))
        if not members:
            raise RequestError("field members: [] names no member to leave")
        left, remaining = self.leave(job, members)
        self.counters["members_left"] += left
        removed = bool(left) and not remaining
        if removed:
            self.expires.pop(job, None)
            self.counters["jobs_left"] += 1
            self.log(f"inwire serve: job {job}: its last member left (asked by {peer[0]}:{peer[1]}); removed, its "
                     f"slots are free")
        return {"job": job, "left": left, "remaining": remaining, "removed": removed}

    def expire(self, now_s: float) -> list[int]:
        """Remove the jobs whose registration ran out by `now_s`; their ids."""
        expired = [job for job, expires in self.expires.items() if expires <= now_s]
        for job in expired:
            del self.expires[job]
            self.remove(job)
            self.counters["jobs_expired"] += 1
            self.log(f"inwire serve: job {job} expired (not renewed) and removed; its slots are free")
        return expired


# ---- the client's side


def new_job(members: Iterable[str | tuple[str | int, int]], slots: int, group: int | str = 0,
            routes: Mapping[int, CliqueRoute] | None = None) -> JobEntry:
    """A job with a random id and token: `members` the (host, port) endpoints (or "host:port") the job's
    islands send from, `slots` its quota, `group` its multicast group (0: unicast results)."""
    endpoints = frozenset(_client_endpoint(member, "member") for member in members)
    group_address = ip_int(group) if isinstance(group, str) else group
    return JobEntry(job=secrets.randbelow((1 << JOB_BITS) - 1) + 1, token=secrets.randbelow((1 << TOKEN_BITS) - 1) + 1,
                    slots=slots, members=endpoints, group=group_address, routes=routes or {})


def _client_endpoint(value: str | tuple[str | int, int], what: str) -> Endpoint:
    """(address as an int, port) of "host:port", (host, port) or (int address, port); a host name is resolved."""
    if isinstance(value, str):
        host, port = parse_endpoint(value, what)
        return ip_int(host), port
    address, port = value
    if isinstance(address, str):
        return ip_int(parse_endpoint(f"{address}:{port}", what)[0]), port
    return address, port


def _aggregator(aggregator: str | Address) -> Address:
    if isinstance(aggregator, str):
        return parse_endpoint(aggregator, "aggregator")
    host, port = aggregator
    return parse_endpoint(f"{host}:{port}", "aggregator")


def _exchange(aggregator: str | Address, body: dict[str, object], key: bytes | None, timeout_s: float,
              retries: int, what: str) -> dict[str, object]:
    """Send the request `body` (a fresh nonce and issue time each try) until an authenticated reply to one of
    them comes; that reply."""
    if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s <= 60):
        raise ValueError(f"timeout_s must lie in (0, 60] seconds, got {timeout_s!r}")
    if type(retries) is not int or not 0 <= retries <= 100:
        raise ValueError(f"retries must be a whole number in [0, 100], got {retries!r}")
    key = _key(key)
    address = _aggregator(aggregator)
    sent: set[str] = set()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        # connected: the kernel passes on datagrams from the aggregator's address only
        sock.connect(address)
        for _ in range(1 + retries):
            nonce = secrets.token_hex(8)
            sent.add(nonce)
            with contextlib.suppress(ConnectionRefusedError):  # an earlier try's ICMP port unreachable
                sock.send(encode({**body, "nonce": nonce, "issued_ms": int(time.time() * 1000)}, key))
            deadline = time.monotonic() + timeout_s
            while (left := deadline - time.monotonic()) > 0:
                sock.settimeout(left)
                try:
                    reply = decode(sock.recv(MAX_MESSAGE + 1), key)
                except (TimeoutError, ConnectionRefusedError, Refused):
                    continue
                if not isinstance(reply.get("nonce"), str) or reply["nonce"] not in sent:
                    continue  # an answer to someone else's request, or an old one
                if reply.get("ok") is not True:
                    raise ControlError(f"{address[0]}:{address[1]} refused the {what}: {reply.get('error')}")
                return reply
    raise ControlError(f"no answer from {address[0]}:{address[1]} to the {what} (is inwire serve running there, "
                       f"with the same operator key?)")


def register(aggregator: str | Address, entry: JobEntry, key: bytes | None = None, ttl_s: int = DEFAULT_TTL_S,
             timeout_s: float = DEFAULT_TIMEOUT_S, retries: int = DEFAULT_RETRIES) -> int:
    """Register (or renew) `entry` at `aggregator` ("host:port" or (host, port)) for `ttl_s` seconds; the first
    aggregator slot of the job's range. Each try waits `timeout_s` for the reply; `retries` more tries follow."""
    if type(ttl_s) is not int or not 1 <= ttl_s <= MAX_TTL_S:
        raise ValueError(f"ttl_s must be a whole number of seconds in [1, {MAX_TTL_S}], got {ttl_s!r}")
    reply = _exchange(aggregator, {"op": "register", "ttl_s": ttl_s, **entry_to_json(entry)}, key, timeout_s,
                      retries, f"registration of job {entry.job}")
    base = reply.get("base")
    if type(base) is not int:
        raise ControlError(f"the reply to the registration of job {entry.job} has no base slot")
    return base


def teardown(aggregator: str | Address, job: int | JobEntry, key: bytes | None = None,
             timeout_s: float = DEFAULT_TIMEOUT_S, retries: int = DEFAULT_RETRIES) -> bool:
    """Tear `job` down at `aggregator`; whether it was registered there (tearing down twice is fine)."""
    job = job.job if isinstance(job, JobEntry) else job
    reply = _exchange(aggregator, {"op": "teardown", "job": job}, key, timeout_s, retries, f"teardown of job {job}")
    return reply.get("removed") is True


def leave(aggregator: str | Address, job: int | JobEntry, members: Iterable[str | tuple[str | int, int]] | None = None,
          key: bytes | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
          retries: int = DEFAULT_RETRIES) -> tuple[int, int]:
    """`members` ("host:port" or (host, port); default: those of `job`, a JobEntry) leave `job` at `aggregator`:
    (how many of them were members there, how many members remain). The job is removed with its last member;
    leaving again, or a job that is not registered, is fine: (0, remaining)."""
    if members is None:
        if not isinstance(job, JobEntry):
            raise ValueError("leave needs the members that leave, or the job's entry to take them from")
        members = job.members
    endpoints = sorted(_show(_client_endpoint(member, "member")) for member in members)
    if not endpoints:
        raise ValueError("leave needs at least one member that leaves")
    job = job.job if isinstance(job, JobEntry) else job
    reply = _exchange(aggregator, {"op": "leave", "job": job, "members": endpoints}, key, timeout_s, retries,
                      f"leave of job {job}")
    left, remaining = reply.get("left"), reply.get("remaining")
    if type(left) is not int or type(remaining) is not int:
        raise ControlError(f"the reply to the leave of job {job} does not say how many members left and remain")
    return left, remaining


class JobLease:
    """Keeps `entry`'s members registered in its job at each of `aggregators` for the body of a with-statement:
    registers on entry (ControlError if one refuses or does not answer; those registered already are left),
    renews every ttl_s / 3 seconds in a daemon thread, and leaves on exit: `entry`'s members leave the job, so
    that other islands registered in the same job go on; the job is removed with its last member. `bases`
    holds each aggregator's first slot of the job; `last_error` the latest renewal or leave that failed
    (renewals go on; the registration lasts ttl_s). An entry without members (a tree's aggregator that only
    sums the levels below it, `jobs.tree_routes`) has no one to leave on exit: its registration runs out
    ttl_s later, unless other leases of the job renew it."""

    def __init__(self, aggregators: str | Address | Sequence[str | Address], entry: JobEntry,
                 ttl_s: int = DEFAULT_TTL_S, key: bytes | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 retries: int = DEFAULT_RETRIES) -> None:
        self.aggregators: list[str | Address]
        if isinstance(aggregators, str) or (isinstance(aggregators, tuple) and len(aggregators) == 2
                                            and isinstance(aggregators[1], int)):
            self.aggregators = [aggregators]  # one aggregator, "host:port" or (host, port)
        else:
            self.aggregators = list(aggregators)
        self.entry = entry
        self.ttl_s = ttl_s
        self.key = _key(key)
        self.timeout_s = timeout_s
        self.retries = retries
        self.bases: dict[str | Address, int] = {}
        self.last_error: ControlError | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "JobLease":
        try:
            for aggregator in self.aggregators:
                self.bases[aggregator] = self._register(aggregator)
        except BaseException:
            self._leave()
            raise
        self._thread = threading.Thread(target=self._renew, name=f"inwire-lease-{self.entry.job}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._leave()

    def _register(self, aggregator: str | Address) -> int:
        return register(aggregator, self.entry, self.key, self.ttl_s, self.timeout_s, self.retries)

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            for aggregator in self.aggregators:
                try:
                    self.bases[aggregator] = self._register(aggregator)
                except ControlError as error:
                    self.last_error = error

    def _leave(self) -> None:
        if not self.entry.members:
            return  # a tree's relay-only level: no member to leave; the registration runs out unless others renew it
        for aggregator in self.bases:
            try:
                leave(aggregator, self.entry, key=self.key, timeout_s=self.timeout_s, retries=self.retries)
            except ControlError as error:
                self.last_error = error  # the registration runs out by itself
