"""Output files that appear whole or not at all.

A command writes each output into a temporary file beside it and renames it over the destination only
when the command succeeds; an error or an interrupt (Ctrl-C) removes the temporary file, so no partial
capture, schedule or Verilog file is ever left behind, and an existing file is kept until the new one is
complete.
"""

import contextlib
import os
import tempfile
from pathlib import Path

from .errors import InwireError


class OutputError(InwireError):
    """An output file cannot be written; the message names it."""


def check_writable(path, option):
    """Fail before any work when `path` cannot be written: its folder is missing or it is a folder."""
    path = Path(path)
    folder = path.parent
    if path.is_dir():
        raise OutputError(f"{option} {path}: is a folder, not a file")
    if not folder.is_dir():
        raise OutputError(f"{option} {path}: folder {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK):
        raise OutputError(f"{option} {path}: folder {str(folder)!r} is not writable")


@contextlib.contextmanager
def atomic_output(path):
    """Yields a temporary path beside `path` (None when `path` is None) to write to; renamed to `path`
    when the body completes, removed when it raises (an error or KeyboardInterrupt)."""
    if path is None:
        yield None
        return
    path = Path(path)
    try:
        # The temporary name keeps the extension: writers such as matplotlib choose the format by it.
        handle, temporary = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=f".part{path.suffix}",
                                             dir=path.parent)
    except OSError as error:
        raise OutputError(f"cannot write {path}: {error.strerror}") from None
    os.close(handle)
    try:
        yield temporary
        # mkstemp makes the file private; the output gets the mode a plain open() would have given it.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
