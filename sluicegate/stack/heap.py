"""The collector of a serving process: no full pass over the start-up heap on the request path.

A started sluicegate process holds tens of thousands of objects that live until exit
(modules, protobuf descriptors, config, tables). CPython's full (generation 2)
collection walks all of them, and runs whenever the objects that survived younger
collections reach a quarter of the old ones; under steady traffic the limiter's
reservations (each lives one window) get there every minute or so. Measured on the
2-core machine (`python -m benchmarks.collector_pauses`, RESULTS "Collector pauses"):
one such collection stalls the event loop for tens of milliseconds, and every request
in flight waits for it.

`gc.freeze()` moves what is alive once the servers are up into the permanent
generation, which no collection walks; garbage made while serving is still collected.
"""

from __future__ import annotations

import gc
import os
from typing import Final

DEFAULTS_ENV: Final = "SLUICEGATE_GC_DEFAULTS"


def settle_heap() -> int:
    """Collect once, then freeze the survivors; returns how many objects were frozen.

    Call when a server has started (config loaded, tables built, listeners bound).
    With SLUICEGATE_GC_DEFAULTS=1 nothing changes (for comparison runs).
    """
    if os.environ.get(DEFAULTS_ENV) == "1":
        return 0
    gc.collect()
    before = gc.get_freeze_count()
    gc.freeze()
    return gc.get_freeze_count() - before
