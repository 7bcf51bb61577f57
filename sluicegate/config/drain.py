"""Draining: the config Envoy should see while some providers take no new requests.

A drained provider is dropped from every route that has another provider left,
so Envoy moves new requests to the others while requests in flight finish on
the drained one. A route whose every provider is drained keeps them: draining
must never leave a model with nowhere to go (a warning says so).
"""

from __future__ import annotations

from collections.abc import Set

from .schema import Config


def drained_view(config: Config, drained: Set[str]) -> tuple[Config, list[str]]:
    """The config with drained providers' backends removed, and warnings for routes
    that could not shed them. `drained` adds to the providers marked `drain: true`."""
    names = set(drained) | {p.name for p in config.providers if p.drain}
    if not names:
        return config, []
    warnings: list[str] = []
    routes = []
    for route in config.routes:
        kept = [b for b in route.backends if b.provider not in names]
        if not kept:
            warnings.append(
                f"route '{route.name}': every provider is drained; it keeps serving from them"
            )
            kept = list(route.backends)
        routes.append(route.model_copy(update={"backends": kept}))
    return config.model_copy(update={"routes": routes}), warnings
