"""Reading the JSON inputs (topologies, schedules, build reports, aggregator maps, benchmark results) with
one-line errors."""

import json
import os
import stat

MAX_JSON_BYTES = 64 * 2**20
"""The largest JSON input read. The largest topology or schedule the tools write is a few MB; the cap keeps
a wrong path (a device such as /dev/zero, a capture) from being read until memory runs out."""

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


def read_json(path, what, error):
    """The document in the JSON file at `path`; `error(message)` when it cannot be read or parsed, the
    message naming `what` the file was meant to be. Only a regular file of at most MAX_JSON_BYTES is read."""
    try:
        # O_NONBLOCK: a FIFO is opened (and refused below) without waiting for a writer.
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as problem:
        raise error(f"cannot read {what} {str(path)!r}: {problem.strerror}") from None
    with open(descriptor, "rb") as handle:
        status = os.fstat(descriptor)
        kind = next((name for test, name in _KINDS if test(status.st_mode)), None)
        if kind:
            raise error(f"{path}: {kind}, not a regular file (the {what} is read from a JSON file)")
        # st_size is 0 for the files of /proc: one byte read beyond the cap catches those, and a file that grows.
        data = b"" if status.st_size > MAX_JSON_BYTES else handle.read(MAX_JSON_BYTES + 1)
        if status.st_size > MAX_JSON_BYTES or len(data) > MAX_JSON_BYTES:
            size = max(status.st_size, len(data))
            size = f"{size:,} bytes" if status.st_size > MAX_JSON_BYTES else f"more than {size - 1:,} bytes"
            raise error(f"{path}: {size}, over the {MAX_JSON_BYTES // 2**20} MiB cap on a JSON input (the {what})")
    try:
        return json.loads(data.decode())
    except UnicodeDecodeError as problem:
        raise error(f"{path}: not a UTF-8 text file (byte {problem.start} is 0x{problem.object[problem.start]:02x}); "
                    f"a {what} file is JSON") from None
    except json.JSONDecodeError as problem:
        raise error(f"{path}: not valid JSON (line {problem.lineno}, column {problem.colno}: "
                    f"{problem.msg})") from None
    except (ValueError, RecursionError) as problem:
        # Python's own limits: an integer of more than 4300 digits, arrays nested too deeply.
        raise error(f"{path}: beyond Python's JSON limits ({str(problem).splitlines()[0]})") from None
