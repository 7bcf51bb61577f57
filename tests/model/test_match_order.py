"""The two halves of routing agree: for any config and any request, the route the ext_proc
routing stage picks (RoutingTable.route_for, from the model) is the route Envoy's pushed
RouteConfiguration matches, read in Envoy's order: the first route whose prefix (or exact
path) and every header matcher match the request (docs/architecture.md, "A request's path").
"""

from __future__ import annotations

from typing import Any

from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.config.route.v3 import route_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate import wire
from sluicegate.config import Config
from sluicegate.filters import RoutingTable
from sluicegate.model import build_model
from sluicegate.xds.translate import ROUTE, translate

PREFIXES = ["/v1", "/v1/", "/v1/chat", "/openai", "/", "/a/b"]
MODELS = ["m1", "m2", "gpt-4o", "team/x:v1"]
PROVIDERS = ["p1", "p2", "p3"]


@st.composite
def configs(draw: st.DrawFn) -> Config:
    """Valid configs: several routes, overlapping prefixes, a model under several
    prefixes; never one model twice under one (normalised) prefix (validation forbids it)."""
    taken: set[tuple[str, str]] = set()
    routes: list[dict[str, Any]] = []
    for index in range(draw(st.integers(1, 5))):
        prefix = draw(st.sampled_from(PREFIXES))
        directory = prefix.rstrip("/") + "/"
        wanted = draw(st.lists(st.sampled_from(MODELS), min_size=1, max_size=3, unique=True))
        models = [m for m in wanted if (directory, m) not in taken]
        if not models:
            continue
        taken.update((directory, m) for m in models)
        backends = draw(st.lists(st.sampled_from(PROVIDERS), min_size=1, max_size=2, unique=True))
        routes.append(
            {
                "name": f"r{index}",
                "models": models,
                "path_prefix": prefix,
                "backends": [{"provider": name} for name in backends],
            }
        )
    if not routes:
        routes.append({"name": "r", "models": ["m1"], "backends": [{"provider": "p1"}]})
    return Config.model_validate(
        {
            "version": 1,
            "admission": {"lane": "exact"},  # the routing stage's header matches
            "listeners": [{"name": "gw", "port": 10000}],
            "providers": [
                {"name": name, "base_url": f"http://10.0.0.{i + 1}/v1"}
                for i, name in enumerate(PROVIDERS)
            ],
            "routes": routes,
        }
    )


def _header_matches(matcher: rc.HeaderMatcher, headers: dict[str, str]) -> bool:
    value = headers.get(matcher.name)
    kind = matcher.WhichOneof("header_match_specifier")
    if kind == "present_match":  # the stream twins' x-sluicegate-stream
        return bool((value is not None) == matcher.present_match)
    assert kind == "string_match" and matcher.string_match.WhichOneof("match_pattern") == "exact"
    return bool(value == matcher.string_match.exact)


def envoy_match(routes: list[rc.Route], path: str, headers: dict[str, str]) -> rc.Route | None:
    """Envoy's route matching, as far as sluicegate's routes use it: the first route whose
    path rule and every header matcher match."""
    for route in routes:
        spec = route.match.WhichOneof("path_specifier")
        if spec == "prefix":
            path_ok = path.startswith(route.match.prefix)
        else:
            assert spec == "path", spec
            path_ok = path == route.match.path
        if path_ok and all(_header_matches(m, headers) for m in route.match.headers):
            return route
    return None


@settings(max_examples=300, deadline=None)
@given(
    config=configs(),
    model=st.sampled_from([*MODELS, "unknown"]),
    prefix=st.sampled_from([*PREFIXES, "/v2/", "/v1x/", "/openai/v1/"]),
    rest=st.sampled_from(["chat/completions", "completions", "", "embeddings"]),
    stream=st.booleans(),
)
def test_ext_proc_picks_the_route_envoy_matches(
    config: Config, model: str, prefix: str, rest: str, stream: bool
) -> None:
    gateway = build_model(config, {})
    (route_config,) = translate(gateway)[ROUTE]
    assert isinstance(route_config, route_pb2.RouteConfiguration)
    (virtual_host,) = route_config.virtual_hosts
    path = prefix.rstrip("/") + "/" + rest
    table = RoutingTable.from_model(gateway)
    picked = table.route_for(model, path)

    # The routing stage sets the model header (and the stream mark for a streamed request);
    # Envoy then matches a POST on them. A stream lands on the same route's stream twin.
    headers = {":method": "POST", wire.MODEL_HEADER: model}
    if stream:
        headers[wire.STREAM_HEADER] = "true"
    matched = envoy_match(list(virtual_host.routes), path, headers)
    assert matched is not None  # the catch-all or a prefix fallback always matches
    if matched.HasField("route"):
        assert picked is not None
        assert matched.route.cluster == f"route-{picked.route}"
        assert matched.name == picked.route
        assert gateway.route_for(model, path) is not None
        assert gateway.route_for(model, path).name == picked.route  # type: ignore[union-attr]
    else:
        # Envoy answers 404 itself: no route of this model serves the path.
        assert matched.direct_response.status == 404
        served = gateway.served.get(model, ())
        assert not any(path.startswith(route.path_prefix) for route in served)
