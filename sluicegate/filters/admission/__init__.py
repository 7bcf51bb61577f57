"""Admission: who may call (keys → tenants), how much (token-aware limits reserved before
the request goes out), how urgently (priority gates), and what it really cost (usage
observer). Used by the routing and usage stages of the ext_proc service."""

from .controller import AdmissionController, make_store
from .keyring import ClientIdentity, KeyRing, presented_key
from .metrics import AdmissionMetrics
from .observer import UsageStream
from .policy import AdmissionPolicy, RoutePolicy, StoreSettings, TenantPolicy, admission_policy
from .stream import AdmissionStream

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
    "UsageStream",
    "admission_policy",
    "make_store",
    "presented_key",
]
