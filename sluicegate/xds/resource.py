"""xDS resource types: their type URLs, push order, names, and what refers to what.

The one home of these facts for the translator and the ADS server, like
go-control-plane's `pkg/resource/v3/resource.go`. Pure functions of protobuf
messages; no I/O.
"""

from __future__ import annotations

import enum
import functools
from typing import Any, Final

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import config_source_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from google.protobuf import any_pb2, symbol_database
from google.protobuf.descriptor import Descriptor, FieldDescriptor

TYPE_PREFIX: Final = "type.googleapis.com/"
LISTENER: Final = TYPE_PREFIX + "envoy.config.listener.v3.Listener"
ROUTE: Final = TYPE_PREFIX + "envoy.config.route.v3.RouteConfiguration"
CLUSTER: Final = TYPE_PREFIX + "envoy.config.cluster.v3.Cluster"
ENDPOINT: Final = TYPE_PREFIX + "envoy.config.endpoint.v3.ClusterLoadAssignment"
SECRET: Final = TYPE_PREFIX + "envoy.extensions.transport_sockets.tls.v3.Secret"
#: ECDS: one filter's configuration, named by the filter (`HttpFilter.name`) that
#: discovers it through `config_discovery`.
EXTENSION_CONFIG: Final = TYPE_PREFIX + "envoy.config.core.v3.TypedExtensionConfig"

#: Make-before-break push order (docs/xds-rules.md, rule 12): SDS, ECDS, CDS, EDS, LDS,
#: RDS. Secrets first since filter configs, clusters and listeners name them; filter
#: configs before the listeners (and clusters' upstream filters) that discover them; a
#: type's dependencies precede it; types not listed here go after these.
PUSH_ORDER: Final = (SECRET, EXTENSION_CONFIG, CLUSTER, ENDPOINT, LISTENER, ROUTE)

#: Types whose SotW responses carry the full state: a name missing from a
#: response is deleted (xDS spec, "Resource types"; docs/xds-rules.md, rule 8).
#: These are also the types with a legacy wildcard subscription (rule 9).
FULL_STATE_TYPES: Final = frozenset({LISTENER, CLUSTER})

#: A cluster's HTTP settings in `typed_extension_protocol_options` are keyed by this
#: name (Envoy finds an extension's options by its type's full name).
HTTP_PROTOCOL_OPTIONS: Final = http_protocol_options_pb2.HttpProtocolOptions.DESCRIPTOR.full_name

_CLUSTER_LOAD_ASSIGNMENT: Final = ENDPOINT.removeprefix(TYPE_PREFIX)
_RDS: Final = hcm_pb2.Rds.DESCRIPTOR.full_name
_SDS_SECRET_CONFIG: Final = secret_pb2.SdsSecretConfig.DESCRIPTOR.full_name
_ANY: Final = any_pb2.Any.DESCRIPTOR.full_name
_EXTENSION_CONFIG_SOURCE: Final = config_source_pb2.ExtensionConfigSource.DESCRIPTOR.full_name
#: Messages that name a resource, or may contain one that does. An
#: ExtensionConfigSource names nothing itself: the filter holding it (HttpFilter,
#: a listener or network Filter) does, by its own `name`; listing it here keeps
#: those filters walked.
_NAMING: Final = frozenset({_RDS, _SDS_SECRET_CONFIG, _ANY, _EXTENSION_CONFIG_SOURCE})


def resource_name(type_url: str, message: Any) -> str:
    """A resource's xDS name: `.cluster_name` for ClusterLoadAssignment, `.name` otherwise.

    xDS spec ("Resource names"): a resource is identified by its name within its type;
    ClusterLoadAssignment is the one type that keeps it in `cluster_name`.
    """
    name: str = message.cluster_name if type_url == ENDPOINT else message.name
    return name


def eds_name(cluster: Any) -> str | None:
    """The ClusterLoadAssignment an EDS Cluster reads, or None for other clusters.

    Envoy's EDS rule: the assignment is named by `eds_cluster_config.service_name`,
    or by the cluster's own name when that is empty.
    """
    if cluster is None:
        return None
    is_eds = cluster.HasField("eds_cluster_config") or (
        cluster.WhichOneof("cluster_discovery_type") == "type"
        and cluster.type == cluster_pb2.Cluster.EDS
    )
    if not is_eds:
        return None
    name: str = cluster.eds_cluster_config.service_name or cluster.name
    return name


#: Where a resource names another: {type URL: names}.
References = dict[str, set[str]]

#: The types that can name other resources over ADS. Route configurations name
#: clusters, but CDS is not a reference Envoy waits on (an unknown cluster is a 503).
#: A filter config delivered by ECDS may name SDS secrets, as a cluster or listener can.
REFERRING_TYPES: Final = frozenset({CLUSTER, LISTENER, EXTENSION_CONFIG})


def references(type_url: str, message: Any, memo: dict[bytes, References] | None = None
               ) -> References:  # fmt: skip
    """Resources over ADS that `message` needs, as {type URL: names}.

    xDS spec, "eventual consistency considerations": a client waits for every
    resource another one names, so they belong in the same snapshot
    (docs/xds-rules.md, rule 14). An EDS Cluster names its ClusterLoadAssignment,
    a listener's HTTP connection manager its RouteConfiguration (RDS), any
    `SdsSecretConfig` (TLS transport sockets, credential injectors) its Secret,
    and any filter with `config_discovery` (an HCM's or a cluster's HttpFilter, a
    listener or network Filter) its TypedExtensionConfig (ECDS), by the filter's name.
    Only references served by ADS count: a file or another server is not the
    snapshot's to hold. Nested `Any`s are unpacked when this process knows their
    type (Envoy nests most configuration in them); `memo` caches what an `Any`
    names by its bytes, since many clusters share the same filters.
    """
    found: References = {}
    if type_url not in REFERRING_TYPES:
        return found
    if type_url == CLUSTER:
        service = eds_name(message)
        if service is not None and _from_ads(message.eds_cluster_config.eds_config):
            found[ENDPOINT] = {service}
    _collect(message, found, {} if memo is None else memo)
    return found


def _from_ads(source: config_source_pb2.ConfigSource) -> bool:
    return bool(source.HasField("ads"))


def _collect(message: Any, found: References, memo: dict[bytes, References]) -> None:
    """Add what `message` and every message nested in it name to `found`."""
    full_name = message.DESCRIPTOR.full_name
    if full_name == _ANY:
        key = message.type_url.encode() + b"\0" + message.value
        inner = memo.get(key)
        if inner is None:
            inner = memo[key] = {}
            unpacked = _unpack(message)
            if unpacked is not None:
                _collect(unpacked, inner, memo)
        for wanted, names in inner.items():
            found.setdefault(wanted, set()).update(names)
        return
    if full_name == _RDS:
        if _from_ads(message.config_source) and message.route_config_name:
            found.setdefault(ROUTE, set()).add(message.route_config_name)
    elif full_name == _SDS_SECRET_CONFIG and _from_ads(message.sds_config) and message.name:
        found.setdefault(SECRET, set()).add(message.name)
    elif (
        _discovers(message.DESCRIPTOR)
        and message.HasField("config_discovery")
        and _from_ads(message.config_discovery.config_source)
        and message.name
    ):
        # ECDS: Envoy subscribes to the filter's config by the filter's name.
        found.setdefault(EXTENSION_CONFIG, set()).add(message.name)
    for field, value in message.ListFields():
        kind = _field_kind(field)
        if kind is _Kind.SKIP:
            continue
        children: Any = (
            value.values() if kind is _Kind.MAP else value if kind is _Kind.REPEATED else (value,)
        )
        for child in children:
            _collect(child, found, memo)


class _Kind(enum.Enum):
    SKIP = "skip"  # not a message, or no message in it can name a resource
    SINGLE = "single"
    REPEATED = "repeated"
    MAP = "map"  # a map whose values are messages


@functools.cache
def _field_kind(field: FieldDescriptor) -> _Kind:
    entry = field.message_type
    if field.type != FieldDescriptor.TYPE_MESSAGE or entry is None:
        return _Kind.SKIP
    if entry.GetOptions().map_entry:
        value = entry.fields_by_name["value"]
        if value.type != FieldDescriptor.TYPE_MESSAGE or not _may_name(value.message_type):
            return _Kind.SKIP
        return _Kind.MAP
    if not _may_name(entry):
        return _Kind.SKIP
    return _Kind.REPEATED if field.is_repeated else _Kind.SINGLE


@functools.cache
def _discovers(descriptor: Descriptor) -> bool:
    """Whether this is a filter that can take its config from ECDS: a `name` and a
    `config_discovery` ExtensionConfigSource (HttpFilter, listener and network Filter)."""
    discovery = descriptor.fields_by_name.get("config_discovery")
    return (
        "name" in descriptor.fields_by_name
        and discovery is not None
        and discovery.message_type is not None
        and discovery.message_type.full_name == _EXTENSION_CONFIG_SOURCE
    )


@functools.cache
def _may_name(descriptor: Descriptor) -> bool:
    """Whether a message of this type can hold a reference (or an Any that might).

    Most of a cluster (circuit breakers, outlier detection, durations) cannot, and
    skipping it makes the consistency check cheap next to building the snapshot."""
    seen: set[str] = set()
    stack = [descriptor]
    while stack:
        current = stack.pop()
        if current.full_name in _NAMING:
            return True
        if current.full_name in seen:
            continue
        seen.add(current.full_name)
        stack.extend(f.message_type for f in current.fields if f.message_type is not None)
    return False


def _unpack(packed: any_pb2.Any) -> Any:
    """The message in an Any, or None when its type is not known to this process."""
    full_name = packed.type_url.rsplit("/", 1)[-1]
    try:
        cls = symbol_database.Default().GetSymbol(full_name)
    except KeyError:
        return None
    message = cls()
    packed.Unpack(message)
    return message
