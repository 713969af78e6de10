"""Opening input files (captures, schedules, topologies, reports) that must be regular files.

A folder, a FIFO, a device or a socket given where a file is read is refused by name in one line: a folder
would fail with a bare "Is a directory", a FIFO would wait for a writer forever, and a device such as
/dev/zero never ends.
"""

import os
import stat

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


def open_regular(path, what, error, form="a file"):
    """`path` opened for reading in binary; `error(message)` when it cannot be opened or is not a regular file,
    the message naming `path`, `what` it was meant to be (e.g. "schedule") and the `form` it is read from."""
    try:
        # O_NONBLOCK: a FIFO is opened (and refused below) without waiting for a writer.
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as problem:
        raise error(f"cannot read {what} {str(path)!r}: {problem.strerror}") from None
    try:
        mode = os.fstat(descriptor).st_mode
        kind = next((name for test, name in _KINDS if test(mode)), None)
        if kind:
            raise error(f"{path}: {kind}, not a regular file (the {what} is read from {form})")
        os.set_blocking(descriptor, True)
        return open(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise
