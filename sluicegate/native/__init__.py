"""sluicegate.native: filters in C that Envoy loads as a dynamic module, where Envoy's own
filters cost a request most (docs/native-filters.md).

    module = resolve_module(config.native_filters.module)  # the path Envoy loads, or None
    path = build(MODULE)                                    # gcc, cached by source hash

The library's filters and the names their configuration uses are in c/; the translator
configures them (xds/translate/native.py).
"""

from .library import MODULE, SCANNER, SOURCE_DIR, NativeBuildError, build
from .resolve import NativeModule, resolve_module

__all__ = [
    "MODULE",
    "SCANNER",
    "SOURCE_DIR",
    "NativeBuildError",
    "NativeModule",
    "build",
    "resolve_module",
]
