"""The served-model table the routing stage consults, swapped whole on reload."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sluicegate import wire
from sluicegate.config import check_model_names
from sluicegate.model import Gateway, first_match

from .request_limits import HeaderCheck, body_too_large, check_headers
from .responses import common, request_body_answer, set_header


@dataclass(frozen=True, slots=True)
class RouteInfo:
    """Which configured route serves a model, and under which client path prefix."""

    route: str
    path_prefix: str = "/v1/"


def _header_value(model: str) -> bytes:
    check_model_names([model])  # validation's rule, kept here for tables built by hand
    return model.encode("utf-8")


def _routed_answer(model: str, *, stream: bool) -> bytes:
    headers = [set_header(wire.MODEL_HEADER, _header_value(model))]
    if stream:  # selects the route's stream twin (timeouts.first_token)
        headers.append(set_header(wire.STREAM_HEADER, b"true"))
    return request_body_answer(common(headers, clear_route_cache=True))


class RoutingTable:
    """Immutable map model -> RouteInfo, with the routing answer for each model prebuilt.

    The server holds one table and replaces the reference on reload; readers
    never see a half-built table, so the hot path takes no lock.
    """

    __slots__ = (
        "_answers",
        "_body_too_large",
        "_by_prefix",
        "_candidates",
        "_max_body_bytes",
        "_routes",
    )

    def __init__(
        self,
        routes: Mapping[str, RouteInfo] | None = None,
        candidates: Mapping[str, Sequence[RouteInfo]] | None = None,
        *,
        max_body_bytes: int | None = None,
    ) -> None:
        """`routes`: a model's first route; `candidates`: every route serving a model, in
        match order, when several serve it under different path prefixes;
        `max_body_bytes`: limits.max_request_body_bytes (None: no declared-length check)."""
        self._max_body_bytes = max_body_bytes
        self._body_too_large = body_too_large(max_body_bytes) if max_body_bytes else b""
        self._routes: dict[str, RouteInfo] = dict(routes or {})
        self._candidates: dict[str, tuple[RouteInfo, ...]] = {
            model: tuple(infos) for model, infos in (candidates or {}).items() if len(infos) > 1
        }
        self._answers: dict[tuple[str, bool], bytes] = {
            (model, stream): _routed_answer(model, stream=stream)
            for model in self._routes
            for stream in (False, True)
        }
        by_prefix: dict[str, set[str]] = {}
        for model, info in self._routes.items():
            by_prefix.setdefault(info.path_prefix, set()).add(model)
        for model, infos in self._candidates.items():
            for info in infos:
                by_prefix.setdefault(info.path_prefix, set()).add(model)
        self._by_prefix = {prefix: frozenset(models) for prefix, models in by_prefix.items()}

    @classmethod
    def empty(cls) -> RoutingTable:
        return cls()

    @classmethod
    def from_model(cls, gateway: Gateway) -> RoutingTable:
        """The table of one resolved config: each model's routes in the model's match
        order (model.match_order), so this stage picks the route Envoy will match."""
        candidates = {
            model: [RouteInfo(route.name, route.path_prefix) for route in routes]
            for model, routes in gateway.served.items()
        }
        return cls(
            {model: infos[0] for model, infos in candidates.items()},
            candidates,
            max_body_bytes=gateway.limits.max_request_body_bytes,
        )

    def check_headers(self, message: Any) -> HeaderCheck:
        """The 431 or 413 for request headers over a limit, or the path to send on with
        credentials removed from its query (request_limits.py)."""
        return check_headers(message, self._max_body_bytes, self._body_too_large)

    def get(self, model: str) -> RouteInfo | None:
        return self._routes.get(model)

    def route_for(self, model: str, path: str | None) -> RouteInfo | None:
        """The route Envoy will pick for `model` at `path` (model.first_match)."""
        candidates = self._candidates.get(model)
        if candidates is None:
            return self._routes.get(model)
        return first_match(candidates, path)

    def models_under(self) -> Mapping[str, frozenset[str]]:
        """Path prefix -> the models served under it (what `<prefix>models` lists)."""
        return self._by_prefix

    def routed_answer(self, model: str, *, stream: bool = False) -> bytes | None:
        """The serialized body answer that routes `model` (a streamed request to the
        route's stream twin), or None if no route serves it."""
        return self._answers.get((model, stream))

    def __contains__(self, model: object) -> bool:
        return model in self._routes

    def __len__(self) -> int:
        return len(self._routes)

    def __iter__(self) -> Iterator[str]:
        return iter(self._routes)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RoutingTable) and self._routes == other._routes

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RoutingTable({self._routes!r})"
