"""Clusters: one per route, `route-<name>`, whose hosts are the route's providers.

Why one cluster per route (docs/architecture.md, "Routing across providers"): Envoy picks a route's
cluster once per request and retries stay inside it, so only providers that are hosts of
one cluster can take over a retry or an ejected provider's traffic.

Discovery: EDS when every provider host is an IP literal, so endpoints change without
touching the cluster. Otherwise a DNS cluster (`envoy.cluster.dns`, strict mode, the
non-deprecated form of STRICT_DNS) with the same load assignment inline: Envoy resolves
and re-resolves the names itself; the control plane never does DNS. Logical DNS
(all_addresses_in_single_endpoint) would keep one host per provider but Envoy allows it
only for single-endpoint clusters.

Per attempt, after the host is chosen, upstream HTTP filters apply the provider's facts
from endpoint metadata (endpoints.py):
1. header_mutation: drop the client's Authorization and any client-sent
   x-sluicegate-provider, then set x-sluicegate-provider from the host's metadata;
2. ext_proc, attempt stage, only when the route needs per-provider rewriting (model names
   or differing URL prefixes) that headers cannot express;
3. only when some provider of the route has a key: the credentials filter (secrets.py), a
   composite matched on x-sluicegate-provider that runs that provider's
   credential_injector with its key from SDS (no key in this config). It comes after the
   attempt stage, so keys are never sent to the ext_proc server;
4. what the provider receives (forwarded_headers.py): every request header off its
   allowlist is removed (the provider header too, now that the credentials filter has
   matched on it), its fixed headers are set (credentials left the query string before
   routing: model_reader.py, filters/request_limits.py). Last,
   so nothing an earlier filter or the router added slips through. With the native
   library (docs/native-filters.md), its filter in place of header_mutation's;
5. upstream_codec, which must be last.
TLS is chosen per provider with transport_socket_matches on endpoint metadata; plain
providers use the cluster's default raw-buffer socket. Verification checks the CA *and*
the certificate's subjectAltName against the SNI name (or the IP), so any CA-signed
certificate for another name is refused.

Balancing is locality-weighted, one locality per provider (endpoints.py says why).

Resilience, from the route's settings (`defaults:` merged with the route's own): connect
timeout (timeouts.py), pool limits and retry budget (circuit_breakers.py), ejection of
failing providers (outlier.py), active health checks (health_checks.py), protocol and
connection reuse (protocol.py). All are per cluster, i.e. per route, except what Envoy
keeps per host: per_host_thresholds.max_connections, ejection state, health.
"""

from __future__ import annotations

from functools import partial

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.common.mutation_rules.v3 import mutation_rules_pb2
from envoy.config.core.v3 import base_pb2
from envoy.extensions.clusters.common.dns.v3 import dns_pb2
from envoy.extensions.clusters.dns.v3 import dns_cluster_pb2
from envoy.extensions.filters.http.header_mutation.v3 import header_mutation_pb2
from envoy.extensions.filters.http.upstream_codec.v3 import upstream_codec_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.transport_sockets.raw_buffer.v3 import raw_buffer_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, tls_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from envoy.type.matcher.v3 import string_pb2

from sluicegate import wire
from sluicegate.model import Gateway, Limits, Provider, Route, Tls
from sluicegate.xds.resource import HTTP_PROTOCOL_OPTIONS

from ._ext_proc import EXT_PROC_FILTER, ext_proc_config
from ._proto import ads_source, pack, struct
from .circuit_breakers import circuit_breakers
from .endpoints import TRANSPORT_MATCH_KEY, load_assignment
from .forwarded_headers import HEADER_MUTATION_FILTER, forwarded_headers_filter
from .health_checks import health_checks
from .memo import RouteMemo
from .outlier import failure_matcher, outlier_detection
from .protocol import common_http_protocol_options, explicit_http_config
from .secrets import credential_filters
from .timeouts import connect_timeout

UPSTREAM_CODEC_FILTER = "envoy.filters.http.upstream_codec"

# What the attempt-stage ext_proc gets with the first message (the request headers): the
# route's prefix (route metadata) and the chosen provider's metadata (path_prefix,
# model_map). Envoy 1.40 sends each as the protobuf text format of core.v3.Metadata.
ATTEMPT_ATTRIBUTES = ("xds.route_metadata", wire.UPSTREAM_HOST_METADATA_ATTRIBUTE)


def build_clusters(gateway: Gateway, memo: RouteMemo | None = None) -> list[cluster_pb2.Cluster]:
    """One cluster per route, sorted by name (unchanged routes' from `memo`)."""
    module = gateway.native_module
    if memo is None:
        clusters = [_cluster(route, gateway.limits, module) for route in gateway.routes]
    else:
        clusters = [
            memo.get(
                ("cluster", module), route, gateway.limits,
                partial(_cluster, route, gateway.limits, module),
            )
            for route in gateway.routes
        ]  # fmt: skip
    return sorted(clusters, key=lambda cluster: cluster.name)


def _cluster(route: Route, limits: Limits, native_module: str | None) -> cluster_pb2.Cluster:
    cluster = cluster_pb2.Cluster(
        name=route.cluster_name,
        connect_timeout=connect_timeout(route),
        lb_policy=cluster_pb2.Cluster.ROUND_ROBIN,
        common_lb_config=cluster_pb2.Cluster.CommonLbConfig(
            locality_weighted_lb_config=cluster_pb2.Cluster.CommonLbConfig.LocalityWeightedLbConfig()
        ),
        typed_extension_protocol_options={
            HTTP_PROTOCOL_OPTIONS: pack(_http_protocol_options(route, limits, native_module))
        },
        transport_socket=base_pb2.TransportSocket(
            name="envoy.transport_sockets.raw_buffer", typed_config=pack(raw_buffer_pb2.RawBuffer())
        ),
        transport_socket_matches=[
            _transport_socket_match(backend.provider)
            for backend in sorted(route.backends, key=lambda b: b.provider.name)
            if backend.provider.tls is not None
        ],
        # Pool limits and retry budget, ejection of failing providers, active checks.
        circuit_breakers=circuit_breakers(route),
        health_checks=health_checks(route),
    )
    detection = outlier_detection(route)
    if detection is not None:
        cluster.outlier_detection.CopyFrom(detection)
    if route.uses_eds:
        cluster.type = cluster_pb2.Cluster.EDS
        cluster.eds_cluster_config.eds_config.CopyFrom(
            ads_source()
        )
    else:
        cluster.cluster_type.CopyFrom(
            cluster_pb2.Cluster.CustomClusterType(
                name="envoy.cluster.dns",
                typed_config=pack(
                    dns_cluster_pb2.DnsCluster(
                        # AUTO (the default) prefers IPv6 and fails where v6 is not routed.
                        dns_lookup_family=dns_pb2.V4_PREFERRED,
                        all_addresses_in_single_endpoint=False,
                    )
                ),
            )
        )
        cluster.load_assignment.CopyFrom(load_assignment(route))
    return cluster


def _http_protocol_options(
    route: Route, limits: Limits, native_module: str | None
) -> http_protocol_options_pb2.HttpProtocolOptions:
    filters = [_header_mutation_filter()]
    if route.needs_attempt_processing:
        filters.append(
            hcm_pb2.HttpFilter(
                name=EXT_PROC_FILTER,
                typed_config=pack(
                    ext_proc_config(
                        wire.STAGE_ATTEMPT,
                        limits,
                        ATTEMPT_ATTRIBUTES,
                        metadata_namespaces=[wire.METADATA_NAMESPACE],
                    )
                ),
            )
        )
    # After the attempt stage, so a provider key never travels to Python in an ext_proc
    # message; the provider header it matches on is set by header_mutation.
    filters.extend(credential_filters(route))
    # Last before the codec: keeps the key just injected, drops the provider header the
    # credentials filter matched on and whatever else is not on the provider's list.
    filters.append(forwarded_headers_filter(route, native_module))
    filters.append(
        hcm_pb2.HttpFilter(
            name=UPSTREAM_CODEC_FILTER, typed_config=pack(upstream_codec_pb2.UpstreamCodec())
        )
    )
    return http_protocol_options_pb2.HttpProtocolOptions(
        explicit_http_config=explicit_http_config(route),
        common_http_protocol_options=common_http_protocol_options(route),
        http_filters=filters,
        outlier_detection=failure_matcher(route),
    )


def _header_mutation_filter() -> hcm_pb2.HttpFilter:
    overwrite = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD

    def append(header: str, key: str) -> mutation_rules_pb2.HeaderMutation:
        value = f"%UPSTREAM_METADATA({wire.METADATA_NAMESPACE}:{key})%"
        return mutation_rules_pb2.HeaderMutation(
            append=base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key=header, value=value), append_action=overwrite
            )
        )

    # The client's Authorization (its sluicegate key) is removed on every attempt, so it
    # never reaches a provider, even one without a key; a keyed provider's comes next from
    # the credentials filter (secrets.py), which matches on the provider header set here.
    # The client's provider header goes first too: the credentials filter must only ever
    # see the one taken from the chosen host.
    mutations = [
        mutation_rules_pb2.HeaderMutation(remove="authorization"),
        mutation_rules_pb2.HeaderMutation(remove=wire.PROVIDER_HEADER),
        append(wire.PROVIDER_HEADER, wire.META_PROVIDER),
    ]
    return hcm_pb2.HttpFilter(
        name=HEADER_MUTATION_FILTER,
        typed_config=pack(
            header_mutation_pb2.HeaderMutation(
                mutations=header_mutation_pb2.Mutations(request_mutations=mutations)
            )
        ),
    )


def _transport_socket_match(provider: Provider) -> cluster_pb2.Cluster.TransportSocketMatch:
    assert provider.tls is not None
    return cluster_pb2.Cluster.TransportSocketMatch(
        name=f"tls-{provider.name}",
        match=struct({TRANSPORT_MATCH_KEY: provider.name}),
        transport_socket=base_pb2.TransportSocket(
            name="envoy.transport_sockets.tls", typed_config=pack(_upstream_tls(provider.tls))
        ),
    )


def _upstream_tls(tls: Tls) -> tls_pb2.UpstreamTlsContext:
    context = tls_pb2.UpstreamTlsContext(sni=tls.sni or "")
    if tls.alpn:
        context.common_tls_context.alpn_protocols.extend(tls.alpn)
    if tls.ca_file is not None:
        # A CA alone proves only that *some* trusted party signed the certificate; the
        # subjectAltName check proves it belongs to this provider.
        san_type = (
            common_pb2.SubjectAltNameMatcher.IP_ADDRESS
            if tls.verify_is_ip
            else common_pb2.SubjectAltNameMatcher.DNS
        )
        context.common_tls_context.validation_context.CopyFrom(
            common_pb2.CertificateValidationContext(
                trusted_ca=base_pb2.DataSource(filename=tls.ca_file),
                match_typed_subject_alt_names=[
                    common_pb2.SubjectAltNameMatcher(
                        san_type=san_type,
                        matcher=string_pb2.StringMatcher(exact=tls.verify_name),
                    )
                ],
            )
        )
    return context
