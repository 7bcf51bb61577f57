"""From the config's `native_filters.module` to the library Envoy is told to load."""

from __future__ import annotations

from dataclasses import dataclass

from sluicegate.config import NATIVE_AUTO, NATIVE_NODE, NATIVE_OFF

from .library import MODULE, NativeBuildError, build


@dataclass(frozen=True, slots=True)
class NativeModule:
    """The library Envoy loads (None: Envoy's own filters) for `setting` (the config's
    native_filters.module), and why, for logs and status; `error` is a failed build's
    whole message (the compiler's words), for the log."""

    setting: str
    path: str | None
    why: str
    error: str = ""


def resolve_module(setting: str) -> NativeModule:
    """`node`: none for Envoys at large (an Envoy whose bootstrap names its own library is
    served that one: stack/native_nodes.py). `off`: none. A path: that path, as Envoy's
    machine has it (not checked here: the control plane may not share Envoy's file
    system; Envoy refuses a config naming a library it cannot load). `auto`: built here
    (library.build), or none when it cannot be, with the first lines of why as the
    reason."""
    if setting == NATIVE_OFF:
        return NativeModule(setting, None, "native_filters.module is off: Envoy's own filters")
    if setting == NATIVE_NODE:
        why = "each Envoy's own library, as its bootstrap names it; Envoy's own filters if none"
        return NativeModule(setting, None, why)
    if setting != NATIVE_AUTO:
        return NativeModule(setting, setting, "native_filters.module names it")
    try:
        path = build(MODULE)
    except NativeBuildError as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        shown = ": ".join(lines[:2]).removesuffix(":")
        why = f"could not build the native filters ({shown}): Envoy's own"
        return NativeModule(setting, None, why, str(error))
    return NativeModule(
        setting, str(path), "built by the control plane (native_filters.module: auto)"
    )
