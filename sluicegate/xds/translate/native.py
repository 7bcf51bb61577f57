"""sluicegate's native filters in Envoy: filters of the C library sluicegate.native builds,
which Envoy loads as a dynamic module, configured here (docs/native-filters.md).

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

from ._proto import pack, struct

DYNAMIC_MODULE_FILTER_TYPE_URL: Final = (
    "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter"
)
STRING_VALUE_TYPE_URL: Final = "type.googleapis.com/google.protobuf.StringValue"
NATIVE_USAGE_READER_FILTER: Final = "sluicegate.usage_reader"
# The filter's name inside the library (c/usage_filter.c).
USAGE_READER: Final = "usage_reader"


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
        "reservation": wire.META_RESERVATION,
        "usage_namespace": wire.USAGE_METADATA_NAMESPACE,
        "count_key": wire.USAGE_CONTENT_EVENTS,
        "members": ",".join(wire.USAGE_MEMBERS),
    }
    return "".join(f"{key}={value}\n" for key, value in pairs.items())


def native_usage_reader(module: str) -> hcm_pb2.HttpFilter:
    """The native usage reader of the library at `module` (a path on Envoy's machine)."""
    config = {
        "dynamic_module_config": {"module": {"local": {"filename": module}}},
        "filter_name": USAGE_READER,
        "filter_config": {"@type": STRING_VALUE_TYPE_URL, "value": usage_reader_config()},
    }
    typed = typed_struct_pb2.TypedStruct(
        type_url=DYNAMIC_MODULE_FILTER_TYPE_URL, value=struct(config)
    )
    return hcm_pb2.HttpFilter(name=NATIVE_USAGE_READER_FILTER, typed_config=pack(typed))
