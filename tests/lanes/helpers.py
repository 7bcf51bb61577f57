"""A small model with `auto` tenants, records and a hand clock for lane steering's tests."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from sluicegate.config import Config
from sluicegate.model import Gateway, build_model
from sluicegate.records import RequestRecord

_HASH = (
    "sha256:00112233445566778899aabbccddeeff:"
    "0000000000000000000000000000000000000000000000000000000000000000"
)

# acme: auto, 10 requests a minute of its own, key `ci` 1,000 tokens per 10 s, key `ops`
# without limits. solo: auto, one key with limits of its own only. fixed: an exact-lane
# tenant with limits (never steered).
MODEL = f"""
version: 1
listeners: [{{name: main, port: 10000}}]
providers: [{{name: p, base_url: "http://127.0.0.1:18081/v1"}}]
routes: [{{name: chat, models: [m], backends: [{{provider: p}}]}}]
tenants:
  - name: acme
    lane: auto
    rate_limits: {{requests: 10, per: 1m}}
    keys:
      - {{name: ci, hash: "{_HASH}", rate_limits: {{tokens: 1000, per: 10s}}}}
      - {{name: ops, hash: "{_HASH[:-1]}1"}}
  - name: solo
    lane: auto
    keys:
      - {{name: solo-key, hash: "{_HASH[:-1]}2", rate_limits: {{input_tokens: 100, per: 1m}}}}
  - name: fixed
    lane: exact
    rate_limits: {{requests: 1, per: 1m}}
    keys: [{{name: fixed-key, hash: "{_HASH[:-1]}3"}}]
"""


def document() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(MODEL)
    return doc


def tenant_doc(doc: Mapping[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(t for t in doc["tenants"] if t["name"] == name)
    return found


def gateway(doc: Mapping[str, Any] | None = None) -> Gateway:
    return build_model(Config.model_validate(doc or document()), {})


def record(
    tenant: str = "acme",
    key_name: str = "ci",
    *,
    status: int = 200,
    input_tokens: int | None = 10,
    output_tokens: int | None = 20,
    stream: bool = False,
    content_events: int | None = None,
    estimate_input: int = 0,
    estimate_output: int = 0,
    stream_id: str = "",
    in_flight: bool = False,
    fast_lane: bool = False,
    code_details: str = "",
) -> RequestRecord:
    return RequestRecord(
        route="chat",
        provider="p",
        model="m",
        model_sent="m",
        tenant=tenant,
        key_name=key_name,
        priority="",
        scenario="",
        status=status,
        status_class=f"{status // 100}xx" if status else "none",
        flags="",
        code_details=code_details,
        error_code="",
        attempts=1,
        stream=stream,
        queue_s=None,
        first_upstream_byte_s=None,
        ttft_s=None,
        first_downstream_byte_s=None,
        duration_s=None,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        start_unix_ns=0,
        content_events=content_events,
        estimate_input=estimate_input,
        estimate_output=estimate_output,
        auto_lane=True,
        stream_id=stream_id,
        in_flight=in_flight,
        fast_lane=fast_lane,
    )
