"""Provider keys: SDS secrets, and the upstream filter that puts the right one on each attempt.

Where keys live (docs/architecture.md, "Routing across providers"): a route's cluster
holds all of its providers as hosts, so a retry can move to another provider, and Envoy's
`credential_injector` is configured per *cluster*. Per-provider keys therefore need a
per-attempt choice among injectors. Envoy 1.40 does that natively:

1. header_mutation (clusters.py) sets `x-sluicegate-provider` from the chosen host's
   metadata on every attempt (after removing the client's Authorization);
2. after the ext_proc attempt stage, if any (so no key is ever sent to Python), a
   composite filter wrapped in a matcher on that header runs the matching provider's
   `credential_injector` (generic credential, `overwrite: true`) whose secret arrives over
   SDS (ADS) as `sluicegate-key-<provider>` with the value `Bearer <key>`.
A provider without a key has no entry, so its attempts carry no Authorization at all.
The provider header itself never leaves Envoy: the allowlist filter that runs last
(forwarded_headers.py) removes it after the injector matched on it.

No key is written into a Cluster, a route or endpoint metadata; Envoy's config_dump shows
the generic secrets as `[redacted]`. A rotated key changes only its Secret: Envoy swaps it
in place, without re-warming any cluster. No Python runs per request for keys.

Measured against the alternatives (an ext_proc round trip per attempt, header formatters
fed from endpoint metadata) in benchmarks/RESULTS.md, "Upstream credentials".
"""

from __future__ import annotations

from envoy.config.core.v3 import base_pb2, extension_pb2
from envoy.extensions.filters.http.credential_injector.v3 import credential_injector_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.http.injected_credentials.generic.v3 import generic_pb2
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2

from sluicegate import wire
from sluicegate.model import Gateway, Provider, Route

from ._proto import ads_source, pack, per_provider_filter

# The upstream filter name (stats appear as cluster.<name>.composite.* and
# cluster.<name>.credential_injector.*).
CREDENTIALS_FILTER = "sluicegate.credentials"
CREDENTIAL_INJECTOR_FILTER = "envoy.filters.http.credential_injector"
GENERIC_CREDENTIAL = "envoy.http.injected_credentials.generic"


def secret_name(provider: Provider) -> str:
    """The SDS resource name of a provider's key."""
    return f"{wire.KEY_SECRET_PREFIX}{provider.name}"


def build_secrets(gateway: Gateway) -> list[secret_pb2.Secret]:
    """One generic Secret (`Bearer <key>`) per keyed provider that a route uses, by name.

    Envoy asks only for the secrets its clusters name; a provider no route uses gets none.
    """
    used = {backend.provider.name for route in gateway.routes for backend in route.backends}
    return [
        secret_pb2.Secret(
            name=secret_name(provider),
            generic_secret=secret_pb2.GenericSecret(
                secret=base_pb2.DataSource(inline_string=provider.authorization)
            ),
        )
        for provider in gateway.providers
        if provider.authorization and provider.name in used
    ]


def credential_filters(route: Route) -> list[hcm_pb2.HttpFilter]:
    """The upstream filter injecting each attempt's provider key; none for a keyless route.

    Must follow the header_mutation that sets wire.PROVIDER_HEADER from the host metadata.
    """
    keyed = sorted(
        (backend.provider for backend in route.backends if backend.provider.authorization),
        key=lambda provider: provider.name,
    )
    if not keyed:
        return []
    runs = {provider.name: (secret_name(provider), _injector(provider)) for provider in keyed}
    # No match (a keyless provider): no action, so no Authorization is added.
    return [per_provider_filter(CREDENTIALS_FILTER, runs)]


def _injector(provider: Provider) -> extension_pb2.TypedExtensionConfig:
    """credential_injector for one provider, its key read from SDS over ADS."""
    generic = generic_pb2.Generic(
        credential=secret_pb2.SdsSecretConfig(
            name=secret_name(provider),
            sds_config=ads_source(),
        ),
        header="authorization",
    )
    return extension_pb2.TypedExtensionConfig(
        name=CREDENTIAL_INJECTOR_FILTER,
        typed_config=pack(
            credential_injector_pb2.CredentialInjector(
                # Retries share one header map: replace what an earlier attempt injected.
                overwrite=True,
                allow_request_without_credential=False,
                credential=extension_pb2.TypedExtensionConfig(
                    name=GENERIC_CREDENTIAL, typed_config=pack(generic)
                ),
            )
        ),
    )
