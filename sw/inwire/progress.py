"""Progress of long steps on stderr, and where a command was when it was interrupted.

`say` prints one plain line ("inwire replay: building the gateware with verilator ..."); `counting`
reports a loop of known length, with a tqdm bar when stderr is a terminal and tqdm is installed, and
otherwise with a plain line at most every few seconds. Both record where the command is, which the
`inwire` command names when Ctrl-C interrupts it.
"""

import contextlib
import sys
import time

PLAIN_EVERY_S = 5.0
"""Least time between two plain progress lines of one loop."""

_state = {"command": None, "where": None}


def reset(command=None):
    _state.update(command=command, where=None)


def where():
    """What the command was doing last, or None."""
    return _state["where"]


def _line(text):
    command = _state["command"]
    print(f"inwire {command}: {text}" if command else text, file=sys.stderr, flush=True)


def say(text):
    """One line on stderr about a step that may take a while; it is also where the command now is."""
    _state["where"] = text
    _line(text)


@contextlib.contextmanager
def counting(total, what):
    """A loop of `total` steps of `what` (e.g. "round"): yields `advance()`, called after each step. Where the
    command is goes back to what it was once the loop ends, so that a loop within a step of another (the
    planner's within a training run) leaves the outer one's place."""
    outer = _state["where"]
    done = 0
    bar = None
    if sys.stderr.isatty():
        try:
            from tqdm import tqdm
        except ImportError:
            tqdm = None
        if tqdm is not None:
            bar = tqdm(total=total, unit=what, file=sys.stderr, leave=False)
    last = time.monotonic()
    _state["where"] = f"{what} 1 of {total}"

    def advance():
        nonlocal done, last
        done += 1
        _state["where"] = f"{what} {min(done + 1, total)} of {total}"
        if bar is not None:
            bar.update(1)
        elif time.monotonic() - last >= PLAIN_EVERY_S and done < total:
            last = time.monotonic()
            _line(f"{done} of {total} {what}s done")
    try:
        yield advance
    finally:
        if bar is not None:
            bar.close()
    # Not on an interrupt, which names the step it stopped in.
    _state["where"] = outer
