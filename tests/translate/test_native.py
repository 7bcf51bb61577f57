"""The native usage reader in translation (xds/translate/native.py, docs/native-filters.md):
in place of Envoy's three readers, where they were, the observer kept."""

from __future__ import annotations

from dataclasses import replace

from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from google.protobuf import json_format
from xds.type.v3 import typed_struct_pb2

from sluicegate.xds.translate import LISTENER, translate
from sluicegate.xds.translate.native import NATIVE_USAGE_READER_FILTER, usage_reader_config
from sluicegate.xds.translate.stream_usage import SSE_TO_METADATA_FILTER
from sluicegate.xds.translate.usage import (
    JSON_TO_METADATA_FILTER,
    STREAM_USAGE_FILTER,
    USAGE_FILTER,
)

from .cases import model_of

LIBRARY = "/opt/sluicegate/libsluicegate_native.so"
ENVOYS = [USAGE_FILTER, JSON_TO_METADATA_FILTER, STREAM_USAGE_FILTER, SSE_TO_METADATA_FILTER]


def filter_names(case: str, native_module: str | None) -> list[str]:
    (listener,) = translate(replace(model_of(case), native_module=native_module))[LISTENER]
    assert isinstance(listener, listener_pb2.Listener)
    manager = hcm_pb2.HttpConnectionManager()
    assert listener.filter_chains[0].filters[-1].typed_config.Unpack(manager)
    return [f.name for f in manager.http_filters]


def test_the_native_reader_takes_the_place_of_envoys_three() -> None:
    """With token limits the observer (Python, large JSON answers) stays, before it."""
    envoys = filter_names("token_limits", None)
    native = filter_names("token_limits", LIBRARY)
    first = envoys.index(JSON_TO_METADATA_FILTER)
    assert envoys[first - 1 : first + 3] == ENVOYS
    after = envoys.index(SSE_TO_METADATA_FILTER) + 1
    assert native == [*envoys[:first], NATIVE_USAGE_READER_FILTER, *envoys[after:]]
    assert not set(ENVOYS[1:]) & set(native)


def test_the_library_is_named_by_its_path() -> None:
    (listener,) = translate(replace(model_of("single_provider"), native_module=LIBRARY))[LISTENER]
    assert isinstance(listener, listener_pb2.Listener)
    manager = hcm_pb2.HttpConnectionManager()
    assert listener.filter_chains[0].filters[-1].typed_config.Unpack(manager)
    (native,) = [f for f in manager.http_filters if f.name == NATIVE_USAGE_READER_FILTER]
    typed = typed_struct_pb2.TypedStruct()
    assert native.typed_config.Unpack(typed)
    config = json_format.MessageToDict(typed.value)
    assert config["dynamic_module_config"] == {"module": {"local": {"filename": LIBRARY}}}
    assert config["filter_config"]["value"] == usage_reader_config()
