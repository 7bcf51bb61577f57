"""Labels are names the config declares, `other`, or `none`: never what a request made up."""

from __future__ import annotations

import dataclasses

import yaml

from sluicegate import wire
from sluicegate.config import Config
from sluicegate.model import build_model
from sluicegate.records import LABELS, NONE, OTHER, Declared, decode
from sluicegate.testing import metadata_fields

from .helpers import MODEL, gateway, log_record, streamed


def test_declared_names_come_from_the_model() -> None:
    declared = Declared.from_gateway(gateway(scenarios=["chat", "long"]))
    assert declared.routes == {"chat"}
    assert declared.providers == {"alpha", "beta"}
    assert declared.models == {"m", "m2"}
    assert declared.tenants == {"acme", "anonymous"}
    assert declared.priorities == {"interactive", "batch"}
    assert declared.scenarios == {"chat", "long", "default"}
    assert declared.model_maps == {"alpha": {"m": "m-alpha"}}


def test_a_declared_record_keeps_its_names() -> None:
    declared = Declared.from_gateway(gateway())
    record = decode(log_record(streamed()), declared.model_maps)
    assert dict(zip(LABELS, declared.labels(record), strict=True)) == {
        "route": "chat", "provider": "alpha", "model": "m", "tenant": "acme",
        "priority": "interactive", "scenario": "default",
    }  # fmt: skip


def test_undeclared_names_are_other_and_missing_ones_none() -> None:
    declared = Declared.from_gateway(gateway())
    meta = metadata_fields({
        wire.META_MODEL: "made-up-model", wire.META_TENANT: "ghost",
        wire.META_PRIORITY: "urgent!", wire.META_SCENARIO: "not-declared",
    })  # fmt: skip
    record = decode(
        log_record(streamed(**{**meta, wire.RECORD_ROUTE: "not-found",
                               wire.RECORD_PROVIDER: "-"})),
        declared.model_maps,
    )  # fmt: skip
    assert declared.labels(record) == (OTHER, NONE, OTHER, OTHER, OTHER, OTHER)
    empty = decode(log_record({}), declared.model_maps)
    assert declared.labels(empty) == (NONE,) * 6
    unresolved = metadata_fields({wire.META_PRIORITY: "none"})  # a refusal before the class
    record = decode(log_record(streamed(**unresolved)), {})
    assert declared.labels(record)[4] == NONE


def test_a_million_models_make_one_label_value() -> None:
    declared = Declared.from_gateway(gateway())
    base = decode(log_record(streamed()), declared.model_maps)
    values = {
        declared.labels(dataclasses.replace(base, model=f"model-{i}"))[2] for i in range(10_000)
    }
    assert values == {OTHER}


def test_the_key_name_is_never_a_label() -> None:
    declared = Declared.from_gateway(gateway())
    record = decode(log_record(streamed()), declared.model_maps)
    assert record.key_name == "ci"
    assert "ci" not in declared.labels(record)


def test_a_request_envoy_routed_alone_has_its_clients_scenario_else_its_routes() -> None:
    """The model reader writes what the client asked for (wire.META_SCENARIO_ASKED); the
    record judges it as the routing stage does (records.scenario_of)."""
    declared = Declared.from_gateway(gateway(scenarios=["chat", "long"]))

    def scenario(meta: dict[str, str], route: str = "chat") -> str:
        fields = streamed(**{**metadata_fields(meta), wire.RECORD_ROUTE: route})
        record = decode(log_record(fields), declared.model_maps, declared.record_defaults)
        assert declared.labels(record)[5] == (record.scenario or NONE)
        return record.scenario

    assert scenario({wire.META_SCENARIO_ASKED: " Long "}) == "long"
    assert scenario({wire.META_SCENARIO_ASKED: "chat, long"}) == "long"  # a repeated header
    assert scenario({wire.META_SCENARIO_ASKED: "made-up"}) == "default"  # the route's
    assert scenario({}) == "default"
    # The routing stage's own judgement stands; a request no route served has none.
    assert scenario({wire.META_SCENARIO: "chat", wire.META_SCENARIO_ASKED: "long"}) == "chat"
    assert scenario({wire.META_SCENARIO_ASKED: "long"}, route="models") == ""


def test_without_tenants_a_request_envoy_routed_is_the_anonymous_tenants() -> None:
    """As the routing stage records it: the anonymous tenant, the default class; a request
    no route served stays without (the model reader names neither in the fast lane)."""
    document = yaml.safe_load(MODEL)
    del document["tenants"]
    declared = Declared.from_gateway(build_model(Config.model_validate(document), {}))

    def names(route: str, meta: dict[str, str]) -> tuple[str, str]:
        fields = streamed(**{**metadata_fields(meta), wire.RECORD_ROUTE: route})
        record = decode(log_record(fields), declared.model_maps, declared.record_defaults)
        return record.tenant, record.priority

    assert names("chat", {wire.META_MODEL: "m"}) == ("anonymous", "batch")
    assert names("models", {}) == ("", "")
    # Envoy's refusals are the anonymous tenant's, without a class, as the routing stage's.
    assert names(wire.NOT_FOUND_ROUTE, {}) == ("anonymous", "")
    assert names("answered-json", {}) == ("anonymous", "")
    # What the routing stage wrote stands.
    refused = {wire.META_TENANT: "anonymous", wire.META_PRIORITY: "none"}
    assert names(wire.NOT_FOUND_ROUTE, refused) == ("anonymous", "none")
    # With tenants, what the model reader names stands and nothing else is made up.
    with_tenants = Declared.from_gateway(gateway())
    fields = streamed(**metadata_fields({wire.META_MODEL: "m"}))
    record = decode(log_record(fields), with_tenants.model_maps, with_tenants.record_defaults)
    assert (record.tenant, record.priority) == ("", "")
