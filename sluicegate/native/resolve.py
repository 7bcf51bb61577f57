"""From the config's `native_filters.module` to the library Envoy is told to load."""

from __future__ import annotations

from dataclasses import dataclass

from sluicegate.config import NATIVE_AUTO, NATIVE_OFF

from .build import MODULE, NativeBuildError, build


@dataclass(frozen=True, slots=True)
class NativeModule:
    """The library Envoy loads (None: Envoy's own filters) and why, for logs and status."""

    path: str | None
    why: str


def resolve_module(setting: str) -> NativeModule:
    """`off`: none. A path: that path, as Envoy's machine has it (not checked here: the
    control plane may not share Envoy's file system; Envoy refuses a config naming a
    library it cannot load). `auto`: built here (build.build), or none when it cannot be,
    with the compiler's first line as the reason."""
    if setting == NATIVE_OFF:
        return NativeModule(None, "native_filters.module is off: Envoy's own filters")
    if setting != NATIVE_AUTO:
        return NativeModule(setting, "native_filters.module names it")
    try:
        path = build(MODULE)
    except NativeBuildError as error:
        first = str(error).splitlines()[0]
        return NativeModule(None, f"could not build the native filters ({first}): Envoy's own")
    return NativeModule(str(path), "built by the control plane (native_filters.module: auto)")
