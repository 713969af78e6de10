"""Islands that average in threads, as the averaging tests run them: each a `CliqueAverager` of period 1
through its own exchange."""

import threading
import time

from inwire.train.averaging import CliqueAverager


def average_in_threads(models, exchanges, schedules, steps, named=(), first=None, ready=None):
    """Each island of `models` averages its model `steps` times along `schedules[island]` through
    `exchanges[island]` (its `named_parameters()` for islands in `named`), each in its own thread, all at once
    or, with `first`, that island alone until `ready()` holds (an AssertionError after 10 s). {island: its
    error or None}."""
    outcome = {}

    def island(name):
        averager = CliqueAverager(1, island=name, schedule=schedules[name], exchange=exchanges[name])
        try:
            for _ in range(steps):
                averager.average_parameters(models[name].named_parameters() if name in named
                                            else models[name].parameters())
            outcome[name] = None
        except Exception as error:  # the caller's test reports it
            outcome[name] = error

    threads = {name: threading.Thread(target=island, args=(name,)) for name in models}
    if first is not None:
        threads[first].start()
        deadline = time.monotonic() + 10
        while not ready():
            if time.monotonic() > deadline:
                raise AssertionError(f"island {first} was not ready for the others within 10 s")
            time.sleep(0.01)
    for name, thread in threads.items():
        if name != first:
            thread.start()
    for thread in threads.values():
        thread.join(timeout=60)
    return outcome
