"""sluicegate.model: one config load, resolved once, for every consumer.

    gateway = build_model(config, api_keys)
    gateway.routes, gateway.providers, gateway.listeners, gateway.tenants, gateway.admission
    gateway.route_for(model, path)     # the one match rule (routes.first_match)

Built by `sluicegate.stack` per load from a validated Config and handed to the
translator (`sluicegate.xds.translate`: Envoy resources) and to the ext_proc server
(`sluicegate.filters`: routing table and admission policy). docs/architecture.md,
"The resolved model".
"""

from .admission import Admission, Tenant
from .gateway import (
    LISTENER_PREFIX,
    ROUTE_CONFIG_PREFIX,
    Gateway,
    Limits,
    Listener,
    Role,
    build_model,
)
from .limit_slots import MIN_SLOTS, LimitSlots, assign_slots
from .providers import SYSTEM_CA_FILE, HealthCheck, Provider, Scheme, Tls, is_ip
from .routes import (
    CLUSTER_PREFIX,
    LATENCY,
    Backend,
    EnvoyGate,
    Gate,
    Route,
    Routing,
    first_match,
    gate_name,
    match_order,
)

__all__ = [
    "CLUSTER_PREFIX",
    "LATENCY",
    "LISTENER_PREFIX",
    "MIN_SLOTS",
    "ROUTE_CONFIG_PREFIX",
    "SYSTEM_CA_FILE",
    "Admission",
    "Backend",
    "EnvoyGate",
    "Gate",
    "Gateway",
    "HealthCheck",
    "LimitSlots",
    "Limits",
    "Listener",
    "Provider",
    "Role",
    "Route",
    "Routing",
    "Scheme",
    "Tenant",
    "Tls",
    "assign_slots",
    "build_model",
    "first_match",
    "gate_name",
    "is_ip",
    "match_order",
]
