"""Admission: who may call (keys → tenants), how much (token-aware limits reserved before
the request goes out), how urgently (priority gates), and what it really cost (usage
read by Envoy and charged from each request's record; the usage observer for large JSON
answers). Used by the routing and usage stages and the ext_proc server's record sink."""

from .charge import charge_fast_lane, charge_finished, charge_pending, charge_record
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
    "charge_fast_lane",
    "charge_finished",
    "charge_pending",
    "charge_record",
    "make_store",
    "presented_key",
]
