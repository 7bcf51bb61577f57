"""The running stack: the processes of `sluicegate up` and the servers they run.

`up` (stack/up.py) carries no traffic: it starts the mock providers, the control plane
(`sluicegate control-plane`, stack/control_plane.py), the main ext_proc server and the
replicas (`sluicegate ext-proc`, stack/replica.py) and Envoy as child processes,
restarts any that dies (stack/supervisor.py), adopts those a killed `up` left running
(stack/adoption.py) and answers `/status` for all of them (stack/up_http.py), which
`sluicegate status` prints as text (stack/status_text.py).

Names are imported on first use, so `sluicegate ext-proc` (stack.replica) does not load
the control plane, the xDS server and the translator it never uses: a replica that `up`
restarts is serving sooner.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sluicegate.stack.control_plane import ControlPlane, ReloadOutcome
    from sluicegate.stack.status_text import render_status, status_problems
    from sluicegate.stack.up import UpOptions, run_up

__all__ = [
    "ControlPlane",
    "ReloadOutcome",
    "UpOptions",
    "render_status",
    "run_up",
    "status_problems",
]

_HOMES = {
    "ControlPlane": "sluicegate.stack.control_plane",
    "ReloadOutcome": "sluicegate.stack.control_plane",
    "UpOptions": "sluicegate.stack.up",
    "run_up": "sluicegate.stack.up",
    "render_status": "sluicegate.stack.status_text",
    "status_problems": "sluicegate.stack.status_text",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'sluicegate.stack' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
