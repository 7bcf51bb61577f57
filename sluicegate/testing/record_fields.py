"""A request's metadata as the record's fields, as Envoy's OpenTelemetry access log
formats them (wire.metadata_field): for tests and benchmarks that make records."""

from __future__ import annotations

import json
from collections.abc import Mapping

from sluicegate import wire


def envoy_text(value: object) -> str:
    """A metadata value as `%DYNAMIC_METADATA(<namespace>:<key>)%` writes it: a string as
    it is, a boolean or a number as JSON, "-" for none."""
    if value is None:
        return "-"
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def _fields(namespace: str, values: Mapping[str, object]) -> dict[str, str]:
    """Every field of `namespace` the record carries, "-" for a key not in `values` (as
    when the namespace held only `values`), and any other key of `values` too."""
    fields = {field: "-" for field, _ in wire.record_metadata_keys(namespace)}
    fields.update(
        {wire.metadata_field(namespace, key): envoy_text(value) for key, value in values.items()}
    )
    return fields


def metadata_fields(values: Mapping[str, object]) -> dict[str, str]:
    """The record's fields of a request whose wire.METADATA_NAMESPACE holds `values`."""
    return _fields(wire.METADATA_NAMESPACE, values)


def usage_fields(values: Mapping[str, object]) -> dict[str, str]:
    """The record's fields of a request whose wire.USAGE_METADATA_NAMESPACE holds
    `values`."""
    return _fields(wire.USAGE_METADATA_NAMESPACE, values)
