"""Reading the JSON inputs (topologies, schedules, build reports, aggregator maps, benchmark results) with
one-line errors."""

import json
import os
from collections.abc import Callable
from typing import Any

from ..inputs import open_regular

MAX_JSON_BYTES = 64 * 2**20
"""The largest JSON input read. The largest topology or schedule the tools write is a few MB; the cap keeps
a wrong path (a device such as /dev/zero, a capture) from being read until memory runs out."""


def read_json(path: str | os.PathLike[str], what: str, error: Callable[[str], Exception]) -> Any:
    """The document in the JSON file at `path`; `error(message)` when it cannot be read or parsed, the
    message naming `what` the file was meant to be. Only a regular file of at most MAX_JSON_BYTES is read."""
    with open_regular(path, what, error, "a JSON file") as handle:
        size = os.fstat(handle.fileno()).st_size
        # st_size is 0 for the files of /proc: one byte read beyond the cap catches those, and a file that grows.
        data = b"" if size > MAX_JSON_BYTES else handle.read(MAX_JSON_BYTES + 1)
        if size > MAX_JSON_BYTES or len(data) > MAX_JSON_BYTES:
            shown = f"{size:,} bytes" if size > MAX_JSON_BYTES else f"more than {len(data) - 1:,} bytes"
            raise error(f"{path}: {shown}, over the {MAX_JSON_BYTES // 2**20} MiB cap on a JSON input (the {what})")
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
