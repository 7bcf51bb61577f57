"""sluicegate's native filters in Envoy: filters of the C library sluicegate.native builds,
which Envoy loads as a dynamic module, configured here (docs/native-filters.md).

The model reader (c/model_filter.c) is the Lua model reader (model_reader.py) in C: the
same facts (ReaderFacts), written as its configuration instead of into Lua source.
Discovered by name over ADS like the Lua one (envoy_routing.py), under a name of its
own: Envoy refuses another type under a name it already knows.

The header allowlist (c/forwarded_headers.c) is an upstream filter, in each route's
cluster in place of header_mutation's (forwarded_headers.py writes its configuration from
the same lists).

The usage reader is one filter in place of three of Envoy's (usage.py, stream_usage.py):
json_to_metadata on a JSON answer, sse_to_metadata on an event stream, and the Lua filter
that counts a stream's content events and cuts the usage event the gateway asked for. It
reads wire.USAGE_HEADER itself, so no matcher wraps it, holds no answer back (it reads the
bytes as they pass) and parses no event's JSON into a document.

Envoy 1.40's DynamicModuleFilter takes its module by `module.local.filename` (an absolute
path; `inline_bytes` is refused), and the venv's protos (xds-protos 1.85) lack that field,
so the config goes as an `xds.type.v3.TypedStruct` of the message, as record_log.py does.
Envoy refuses a whole listener whose module it cannot load: the translator names the
library only when the control plane was told Envoy has it (native_filters.module, or
with `node` the Envoy's own bootstrap: stack/native_nodes.py).
"""

from __future__ import annotations

from typing import Final

from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from xds.type.v3 import typed_struct_pb2

from sluicegate import wire
from sluicegate.config import LANE_EXACT, LANE_FAST
from sluicegate.local_replies import (
    DUPLICATE_PREFIX,
    INVALID_PRIORITY,
    MAX_TOKENS_PREFIX,
    MODEL_NOT_ALLOWED,
    UNKNOWN_CLIENT,
)

from ._proto import pack, struct
from .model_reader import META_BODY_PROBLEM, ReaderFacts

DYNAMIC_MODULE_FILTER_TYPE_URL: Final = (
    "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter"
)
STRING_VALUE_TYPE_URL: Final = "type.googleapis.com/google.protobuf.StringValue"
NATIVE_USAGE_READER_FILTER: Final = "sluicegate.usage_reader"
NATIVE_MODEL_READER_FILTER: Final = "sluicegate.native_model_reader"
# The filters' names inside the library (c/usage_filter.c, c/model_filter.c,
# c/forwarded_headers.c).
USAGE_READER: Final = "usage_reader"
MODEL_READER: Final = "model_reader"
FORWARDED_HEADERS: Final = "forwarded_headers"


# The reader names whose answers the usage reader reads; any other name it does not know
# (a newer routing stage's) is read by media type, as Envoy's readers did.
_READ_HERE: Final = (wire.USAGE_BY_LOG, wire.USAGE_BY_STREAM, wire.USAGE_BY_STREAM_CHUNKS)


def usage_reader_config() -> str:
    """The usage reader's configuration: `key=value` lines of wire's names, which the
    library takes from here rather than keeping copies (c/usage_filter.c reads them)."""
    pairs = {
        "usage_header": wire.USAGE_HEADER,
        "by_log": wire.USAGE_BY_LOG,
        "by_stream": wire.USAGE_BY_STREAM,
        "by_chunks": wire.USAGE_BY_STREAM_CHUNKS,
        # The names whose answers nobody in Envoy reads (the observer's, and none).
        "by_nobody": ",".join(sorted(set(wire.USAGE_READERS) - set(_READ_HERE))),
        "namespace": wire.METADATA_NAMESPACE,
        "injected": wire.META_USAGE_INJECTED,
        "injected_value": wire.USAGE_INJECTED_TRUE,
        "usage_namespace": wire.USAGE_METADATA_NAMESPACE,
        "count_key": wire.USAGE_CONTENT_EVENTS,
        "members": ",".join(wire.USAGE_MEMBERS),
    }
    return "".join(f"{key}={value}\n" for key, value in pairs.items())


def model_reader_config(facts: ReaderFacts) -> str:
    """The model reader's configuration: `key=value` lines of wire's names and `facts`
    (c/model_filter.c reads them; `class`, `asks_usage`, `held` and `tenant` repeat, a
    tenant's fields separated by tabs, which no name holds: config validation; after its
    name, class and auto flag, `all` or `only` and the models it may use, so no model's
    name is read as a marker)."""
    pairs = {
        "namespace": wire.METADATA_NAMESPACE,
        "client_header": wire.CLIENT_HEADER,
        "priority_header": wire.PRIORITY_HEADER,
        "scenario_header": wire.SCENARIO_HEADER,
        "usage_header": wire.USAGE_HEADER,
        "members": ",".join(wire.BODY_READ_MEMBERS),
        "caps": ",".join(wire.MAX_TOKENS_MEMBERS),
        "logprobs": ",".join(wire.LOGPROBS_MEMBERS),
        "prompt": ",".join(wire.PROMPT_MEMBERS),
        "endpoints": ",".join(wire.GENERATION_ENDPOINTS),
        "usage_endpoints": ",".join(wire.STREAM_USAGE_ENDPOINTS),
        "include_usage": wire.INCLUDE_USAGE_MEMBER,
        "default_max_tokens": facts.default_max_tokens,
        "max_output_tokens": facts.max_output_tokens,
        "max_n": wire.MAX_N,
        "log_max_output_tokens": wire.LOG_MAX_OUTPUT_TOKENS,
        "max_scenario_asked": wire.MAX_SCENARIO_ASKED,
        "estimates": int(facts.estimates),
        "scenarios": int(facts.scenarios),
        "lane_exact": LANE_EXACT,
        "lane_fast": LANE_FAST,
        "no_class": wire.NO_PRIORITY_CLASS,
        "unknown_client": UNKNOWN_CLIENT.problem,
        "model_not_allowed": MODEL_NOT_ALLOWED.problem,
        "invalid_priority": INVALID_PRIORITY.problem,
        "duplicate_prefix": DUPLICATE_PREFIX,
        "max_tokens_prefix": MAX_TOKENS_PREFIX,
        "by_stream": wire.USAGE_BY_STREAM,
        "by_log": wire.USAGE_BY_LOG,
        "by_unread": wire.USAGE_UNREAD,
        "by_chunks": wire.USAGE_BY_STREAM_CHUNKS,
        "meta_model": wire.META_MODEL,
        "meta_stream": wire.META_STREAM,
        "meta_problem": META_BODY_PROBLEM,
        "meta_priority": wire.META_PRIORITY,
        "meta_tenant": wire.META_TENANT,
        "meta_key_name": wire.META_KEY_NAME,
        "meta_scenario_asked": wire.META_SCENARIO_ASKED,
        "meta_estimate_input": wire.META_ESTIMATE_INPUT,
        "meta_estimate_output": wire.META_ESTIMATE_OUTPUT,
        "meta_estimate_tokens": wire.META_ESTIMATE_TOKENS,
        "meta_auto_lane": wire.META_AUTO_LANE,
        "meta_charged_tenant": wire.META_CHARGED_TENANT,
        "meta_usage_injected": wire.META_USAGE_INJECTED,
        "injected_value": wire.USAGE_INJECTED_TRUE,
        "query_credentials": ",".join(sorted(wire.QUERY_CREDENTIALS)),
    }
    lines = [f"{key}={value}" for key, value in pairs.items()]
    lines += [f"class={name}" for name in facts.classes]
    lines += [f"asks_usage={model}" for model in sorted(facts.asks_usage)]
    lines += [f"held={model}" for model in sorted(facts.held)]
    for name in sorted(facts.tenants):
        tenant = facts.tenants[name]
        models = ("all",) if tenant.models is None else ("only", *sorted(tenant.models))
        fields = (name, tenant.priority, "1" if tenant.auto else "0", *models)
        lines.append("tenant=" + "\t".join(fields))
    return "".join(line + "\n" for line in lines)


def _dynamic_module_filter(module: str, name: str, config: str) -> typed_struct_pb2.TypedStruct:
    """Filter `name` of the library at `module` (a path on Envoy's machine)."""
    values = {
        "dynamic_module_config": {"module": {"local": {"filename": module}}},
        "filter_name": name,
        "filter_config": {"@type": STRING_VALUE_TYPE_URL, "value": config},
    }
    return typed_struct_pb2.TypedStruct(
        type_url=DYNAMIC_MODULE_FILTER_TYPE_URL, value=struct(values)
    )


def native_usage_reader(module: str) -> hcm_pb2.HttpFilter:
    """The native usage reader of the library at `module` (a path on Envoy's machine)."""
    typed = _dynamic_module_filter(module, USAGE_READER, usage_reader_config())
    return hcm_pb2.HttpFilter(name=NATIVE_USAGE_READER_FILTER, typed_config=pack(typed))


def native_model_reader(module: str, facts: ReaderFacts) -> typed_struct_pb2.TypedStruct:
    """The native model reader's configuration, for the library at `module`."""
    return _dynamic_module_filter(module, MODEL_READER, model_reader_config(facts))


def native_forwarded_headers(name: str, module: str, config: str) -> hcm_pb2.HttpFilter:
    """The upstream filter `name` running the library's forwarded headers filter with
    `config` (forwarded_headers.native_forwarded_headers_config)."""
    typed = _dynamic_module_filter(module, FORWARDED_HEADERS, config)
    return hcm_pb2.HttpFilter(name=name, typed_config=pack(typed))
