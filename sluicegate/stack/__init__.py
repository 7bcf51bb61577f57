"""The running stack: control plane process composition for `sluicegate up`."""

from sluicegate.stack.control_plane import ControlPlane, ReloadOutcome
from sluicegate.stack.up import UpOptions, run_up

__all__ = ["ControlPlane", "ReloadOutcome", "UpOptions", "run_up"]
