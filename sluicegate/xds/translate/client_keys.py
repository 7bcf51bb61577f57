"""Client keys checked by Envoy (the fast lane; docs/fast-lane.md, "Keys").

Envoy's `api_key_auth` filter holds each key with its client, `<lane>/<tenant>/<key
name>`, and looks a presented key up in a hash table: no Python, no per-key hashing. On
a match it writes the client into wire.CLIENT_HEADER and removes the key's headers, so
no provider sees it. A fast-lane client is turned into the request's tenant, key name
and priority by the model reader; an exact-lane client's request goes to the routing
stage, which trusts the header instead of a key (the routing stage is skipped for the
`fast/` prefix: listeners.py). A missing or unknown key is a 401
(local_replies.FAST_LANE_REFUSALS words it as the routing stage does).

The keys come from `secret:` sources (config.resolve_client_keys), never the YAML; the
filter's `credentials` are marked sensitive, so Envoy's config_dump shows them redacted.
"""

from __future__ import annotations

from typing import Final

from envoy.extensions.filters.http.api_key_auth.v3 import api_key_auth_pb2

from sluicegate import wire
from sluicegate.model import Gateway

CLIENT_KEYS_FILTER: Final = "sluicegate.client_keys"
CLIENT_KEYS_EXTENSION: Final = "envoy.filters.http.api_key_auth"


def client_keys_config(gateway: Gateway) -> api_key_auth_pb2.ApiKeyAuth:
    """Every key with a secret, by client name; the headers the routing stage reads a key
    from (wire.CLIENT_KEY_HEADERS), in its order."""
    credentials = sorted(
        (wire.client_name(tenant.lane, tenant.name, key.name), gateway.client_keys[key.name])
        for tenant in gateway.tenants
        for key in tenant.keys
        if key.name in gateway.client_keys
    )
    return api_key_auth_pb2.ApiKeyAuth(
        credentials=[
            api_key_auth_pb2.Credential(key=secret, client=client) for client, secret in credentials
        ],
        key_sources=[api_key_auth_pb2.KeySource(header=name) for name in wire.CLIENT_KEY_HEADERS],
        forwarding=api_key_auth_pb2.Forwarding(header=wire.CLIENT_HEADER, hide_credentials=True),
    )
