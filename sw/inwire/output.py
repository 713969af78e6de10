"""Output files that appear whole or not at all.

A command writes each output into a temporary file beside it and renames it over the destination only
when the command succeeds; an error or an interrupt (Ctrl-C) removes the temporary file, so no partial
capture, schedule or Verilog file is ever left behind, and an existing file is kept until the new one is
complete.

That holds for regular files and new paths. A device, a FIFO or an open descriptor (/dev/stdout) is written
in place instead, the finished output copied into it, since a rename would replace it with a regular file;
a symlink is followed, so that its target is replaced and the link kept.
"""

import contextlib
import os
import re
import shutil
import stat
import sys
import tempfile
from pathlib import Path

from .errors import InwireError


class OutputError(InwireError):
    """An output file cannot be written; the message names it."""


def _names_descriptor(path):
    """Whether `path` leads through its symlinks to a /proc/PID/fd/N entry (/dev/stdout, /dev/fd/3): an open
    descriptor. Even when a regular file is behind it (`> out`), that file is the shell's to keep: renamed
    over, it would lose what the command prints."""
    path = os.path.abspath(path)
    for _ in range(40):  # the kernel's own limit on nested symlinks
        if re.fullmatch(r"/proc/[^/]+/fd", os.path.realpath(os.path.dirname(path))):
            return True
        if not os.path.islink(path):
            return False
        path = os.path.join(os.path.dirname(path), os.readlink(path))
    return False


def writes_in_place(path):
    """Whether `path` is written in place, the finished output copied into it: a device, a FIFO or an open
    descriptor; a regular file or a new path is replaced whole by a rename instead."""
    if _names_descriptor(path):
        return True
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        return False


def _destination(path):
    """The path a rename replaces: the target of a symlink (the link stays), else `path` itself."""
    return Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)


def check_writable(path, option):
    """Fail before any work when `path` cannot be written: its folder is missing or it is a folder."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{option} {path}: is a folder, not a file")
    if writes_in_place(path):
        if not os.access(path, os.W_OK):
            raise OutputError(f"{option} {path}: not writable")
        return
    folder = _destination(path).parent
    if not folder.is_dir():
        raise OutputError(f"{option} {path}: folder {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK):
        raise OutputError(f"{option} {path}: folder {str(folder)!r} is not writable")


@contextlib.contextmanager
def atomic_output(path):
    """Yields a temporary path (None when `path` is None) to write to; when the body completes it is renamed
    over `path`, or copied into it when `path` is written in place, and it is removed when the body raises
    (an error or KeyboardInterrupt). A write that fails (ENOSPC on /dev/full) names `path`."""
    if path is None:
        yield None
        return
    try:
        in_place = writes_in_place(path)
    except OSError as error:
        raise OutputError(f"cannot write {path}: {error.strerror}") from None
    # In place, the temporary file is made where temporary files go (not in /dev); writers get a regular
    # file either way: matplotlib seeks in its PNG.
    destination = Path(path) if in_place else _destination(path)
    try:
        # The temporary name keeps the extension: writers such as matplotlib choose the format by it.
        handle, temporary = tempfile.mkstemp(prefix=f".{destination.stem}.", suffix=f".part{destination.suffix}",
                                             dir=None if in_place else destination.parent)
    except OSError as error:
        raise OutputError(f"cannot write {path}: {error.strerror}") from None
    os.close(handle)
    try:
        with _naming(path, temporary):
            yield temporary
            if in_place:
                _copy(temporary, path)
            else:
                # mkstemp makes the file private; the output gets the mode a plain open() would have given it.
                umask = os.umask(0)
                os.umask(umask)
                os.chmod(temporary, 0o666 & ~umask)
                os.replace(temporary, destination)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def _copy(temporary, path):
    """Write the finished output into the device, FIFO or descriptor at `path`."""
    # What the command printed before comes first where the output goes to its own stdout.
    sys.stdout.flush()
    with open(temporary, "rb") as source, open(path, "wb") as target:
        shutil.copyfileobj(source, target)


@contextlib.contextmanager
def _naming(path, written):
    """An OSError of writing `written` or `path` (it carries no file name, or one of theirs) as an OutputError
    naming `path`."""
    try:
        yield
    except BrokenPipeError:
        raise  # the reader of a pipe left: the command ends quietly, as a filter does
    except OSError as error:
        if error.filename not in (None, written, str(written), path, str(path)):
            raise
        raise OutputError(f"cannot write {path}: {error.strerror or error}") from None


def same_file(first, second):
    """Whether two paths name one file: the same file when both exist (hard links and symlinks included),
    else the same path once resolved."""
    try:
        return os.path.samefile(first, second)
    except OSError:
        return os.path.realpath(first) == os.path.realpath(second)


def check_outputs_apart(outputs, inputs):
    """Refuse, before any work, an output that is one of the command's inputs (writing it would replace what
    the command reads) or another of its outputs (one would replace the other). `outputs` and `inputs` map
    how the command line names each file (an option, or a positional's metavar) to its path, or None; as a
    dict, or as (name, path) pairs where a name gives several."""
    def named(files):
        return [(name, path) for name, path in (files.items() if isinstance(files, dict) else files)
                if path is not None]

    def spelled(name, path):
        return f"{name}{'' if name.endswith(':') else ' '}{path}"  # "--target pcap:x.pcap", "--out x.json"

    outputs, inputs = named(outputs), named(inputs)
    for index, (name, path) in enumerate(outputs):
        for other, source in inputs:
            if same_file(path, source):
                raise OutputError(f"{spelled(name, path)}: the same file as {spelled(other, source)}, which the "
                                  f"command reads; name another output")
        for other, written in outputs[:index]:
            if same_file(path, written):
                raise OutputError(f"{spelled(name, path)}: the same file as {spelled(other, written)}, another "
                                  f"output of the command; name another output")
