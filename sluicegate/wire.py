"""Names that several rooms must agree on: headers, cluster names, metadata keys.

The translator writes them into Envoy config, the ext_proc filter reads and sets
them, the bootstrap declares the clusters. One place, so they cannot drift.
"""

from typing import Final

# Set by the ext_proc filter from the request body's "model"; routes match on it.
MODEL_HEADER: Final = "x-sluicegate-model"
# Set per upstream attempt from the chosen endpoint's metadata (logs, tests).
PROVIDER_HEADER: Final = "x-sluicegate-provider"
# gRPC initial metadata that tells the ext_proc server which stage is calling.
STAGE_METADATA_KEY: Final = "x-sluicegate-stage"
STAGE_ROUTING: Final = "routing"  # downstream HTTP filter: parse body, pick route
STAGE_ATTEMPT: Final = "attempt"  # upstream (per attempt) filter: per-provider rewrites

# Static clusters declared in the bootstrap (never pushed over xDS).
XDS_CLUSTER: Final = "sluicegate_xds"
EXT_PROC_CLUSTER: Final = "sluicegate_ext_proc"

# Endpoint metadata namespace carrying per-provider facts to per-attempt filters.
METADATA_NAMESPACE: Final = "sluicegate"
META_PROVIDER: Final = "provider"
META_PATH_PREFIX: Final = "path_prefix"
META_MODEL_MAP: Final = "model_map"

# Envoy's attribute carrying the chosen host's metadata to an upstream ext_proc.
UPSTREAM_HOST_METADATA_ATTRIBUTE: Final = "xds.upstream_host_metadata"

# SDS name of a provider's upstream key (`sluicegate-key-<provider>`); the Secret holds
# `Bearer <key>`. Keys never appear in clusters, routes or endpoint metadata.
KEY_SECRET_PREFIX: Final = "sluicegate-key-"
