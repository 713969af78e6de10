"""Reading the planner's JSON inputs (topologies, schedules, build reports) with one-line errors."""

import json


def read_json(path, what, error):
    """The document in the JSON file at `path`; `error(message)` when it cannot be read or parsed, the
    message naming `what` the file was meant to be."""
    try:
        with open(path) as handle:
            return json.load(handle)
    except OSError as problem:
        raise error(f"cannot read {what} {str(path)!r}: {problem.strerror}") from None
    except UnicodeDecodeError as problem:
        raise error(f"{path}: not a UTF-8 text file (byte {problem.start} is 0x{problem.object[problem.start]:02x}); "
                    f"a {what} file is JSON") from None
    except json.JSONDecodeError as problem:
        raise error(f"{path}: not valid JSON (line {problem.lineno}, column {problem.colno}: "
                    f"{problem.msg})") from None
