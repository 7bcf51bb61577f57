"""Metric labels with bounded cardinality: only names the config declares.

A label value is one of the names the resolved model declares (routes, providers, served
models, tenants, priority classes, scenarios) or `other`; a value the request did not
have is `none`. So a client that asks for a million model names, or a provider that
answers with odd headers, adds at most one series per label (docs/metrics.md,
"Cardinality"). No key, hash or key name is ever a label.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from sluicegate import wire
from sluicegate.model import Gateway

from .record import RecordDefaults, RequestRecord

OTHER: Final = wire.OTHER_LABEL
# A value the request did not have; also the routing stage's priority for a request it
# refused before resolving its class (wire.NO_PRIORITY_CLASS).
NONE: Final = wire.NO_VALUE_LABEL
# Label names, in the order `Declared.labels` gives their values.
LABELS: Final = ("route", "provider", "model", "tenant", "priority", "scenario")


def _bounded(value: str, declared: frozenset[str]) -> str:
    if value in declared:
        return value
    return OTHER if value and value != NONE else NONE


@dataclass(frozen=True, slots=True)
class Declared:
    """What one config load declares, for labels and for the model sent."""

    routes: frozenset[str] = frozenset()
    providers: frozenset[str] = frozenset()
    models: frozenset[str] = frozenset()
    # A request without a client key is always the routing stage's anonymous tenant.
    tenants: frozenset[str] = frozenset({wire.ANONYMOUS_TENANT})
    priorities: frozenset[str] = frozenset()
    scenarios: frozenset[str] = frozenset()
    # provider -> (client model -> provider model)
    model_maps: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # What a request no routing stage saw (routed by Envoy alone, docs/fast-lane.md) is
    # recorded as: its scenario, and the anonymous tenant without tenants (record.decode).
    record_defaults: RecordDefaults = field(
        default_factory=lambda: RecordDefaults({}, frozenset())
    )

    @classmethod
    def from_gateway(cls, gateway: Gateway) -> Declared:
        admission = gateway.admission
        return cls(
            routes=frozenset(route.name for route in gateway.routes),
            providers=frozenset(provider.name for provider in gateway.providers),
            models=frozenset(model for route in gateway.routes for model in route.models),
            tenants=frozenset(t.name for t in gateway.tenants) | {wire.ANONYMOUS_TENANT},
            priorities=frozenset(item.name for item in admission.priority_classes)
            | {admission.default_priority},
            # Gateway.scenarios include the default scenario (config.DEFAULT_SCENARIO).
            scenarios=frozenset(gateway.scenarios),
            model_maps={p.name: dict(p.model_map) for p in gateway.providers if p.model_map},
            record_defaults=RecordDefaults(
                {route.name: route.scenario for route in gateway.routes},
                frozenset(gateway.scenarios),
                None if gateway.tenants else admission.default_priority,
            ),
        )

    def labels(self, record: RequestRecord) -> tuple[str, str, str, str, str, str]:
        """The record's label values, in LABELS order."""
        return (
            _bounded(record.route, self.routes),
            _bounded(record.provider, self.providers),
            _bounded(record.model, self.models),
            _bounded(record.tenant, self.tenants),
            _bounded(record.priority, self.priorities),
            _bounded(record.scenario, self.scenarios),
        )
