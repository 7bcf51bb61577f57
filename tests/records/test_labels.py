"""Labels are names the config declares, `other`, or `none`: never what a request made up."""

from __future__ import annotations

import dataclasses
import json

from sluicegate import wire
from sluicegate.records import LABELS, NONE, OTHER, Declared, decode

from .helpers import gateway, log_record, streamed


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
    meta = json.dumps({
        wire.META_MODEL: "made-up-model", wire.META_TENANT: "ghost",
        wire.META_PRIORITY: "urgent!", wire.META_SCENARIO: "not-declared",
    })  # fmt: skip
    record = decode(
        log_record(streamed(**{wire.RECORD_METADATA: meta, wire.RECORD_ROUTE: "not-found",
                               wire.RECORD_PROVIDER: "-"})),
        declared.model_maps,
    )  # fmt: skip
    assert declared.labels(record) == (OTHER, NONE, OTHER, OTHER, OTHER, OTHER)
    empty = decode(log_record({}), declared.model_maps)
    assert declared.labels(empty) == (NONE,) * 6
    unresolved = json.dumps({wire.META_PRIORITY: "none"})  # a refusal before the class
    record = decode(log_record(streamed(**{wire.RECORD_METADATA: unresolved})), {})
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
