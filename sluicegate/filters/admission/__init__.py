"""Admission: who may call (keys → tenants), how much (token-aware limits reserved before
the request goes out), how urgently (priority gates), and what it really cost (usage
observer for streams, usage log for JSON answers). Used by the routing and usage stages
and the access-log service of the ext_proc server."""

from .controller import AdmissionController, make_store
from .keyring import ClientIdentity, KeyRing, presented_key
from .metrics import AdmissionMetrics
from .observer import UsageStream
from .policy import AdmissionPolicy, RoutePolicy, StoreSettings, TenantPolicy, admission_policy
from .stream import AdmissionStream
from .usage_log import UsageLog

__all__ = [
    "AdmissionController",
    "AdmissionMetrics",
    "AdmissionPolicy",
    "AdmissionStream",
    "ClientIdentity",
    "KeyRing",
    "RoutePolicy",
    "StoreSettings",
    "TenantPolicy",
    "UsageLog",
    "UsageStream",
    "admission_policy",
    "make_store",
    "presented_key",
]
