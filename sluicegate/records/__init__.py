"""sluicegate.records: one record per request, from Envoy's access log, to /metrics.

    sink = RecordSink(registry)                  # the registry /metrics serves
    sink.load(gateway)        # label sets, model maps, `access_log:` (hot reload)
    server.add_generic_rpc_handlers((logs_handler(sink),))

Envoy's OpenTelemetry access log (xds/translate/record_log.py) sends every request's
record in batches to the ext_proc servers' LogsService; each is decoded once
(`record.decode`, never raises) and counted in the GenAI latency, token and request
metrics with bounded labels. docs/metrics.md.
"""

from .access_log import STDOUT, JsonLinesAccessLog, RecordWriter, record_line
from .billing import (
    SOURCE_COUNTED,
    SOURCE_ERROR,
    SOURCE_ESTIMATE,
    SOURCE_PROVIDER,
    Billed,
    billed,
    billed_in_flight,
    billed_record,
)
from .labels import LABELS, NONE, OTHER, Declared
from .logs_service import LOGS_METHOD_NAME, LOGS_SERVICE_NAME, SLICE, RecordBatches, logs_handler
from .metrics import (
    DURATION_BUCKETS,
    QUEUE_BUCKETS,
    TPOT_BUCKETS,
    TTFT_BUCKETS,
    RecordMetrics,
    time_per_output_token,
)
from .record import RecordDefaults, RequestRecord, decode, fields_of, log_name, scenario_of
from .sink import RecordSink, log_records

__all__ = [
    "DURATION_BUCKETS",
    "LABELS",
    "LOGS_METHOD_NAME",
    "LOGS_SERVICE_NAME",
    "NONE",
    "OTHER",
    "QUEUE_BUCKETS",
    "SLICE",
    "SOURCE_COUNTED",
    "SOURCE_ERROR",
    "SOURCE_ESTIMATE",
    "SOURCE_PROVIDER",
    "STDOUT",
    "TPOT_BUCKETS",
    "TTFT_BUCKETS",
    "Billed",
    "Declared",
    "JsonLinesAccessLog",
    "RecordBatches",
    "RecordDefaults",
    "RecordMetrics",
    "RecordSink",
    "RecordWriter",
    "RequestRecord",
    "billed",
    "billed_in_flight",
    "billed_record",
    "decode",
    "fields_of",
    "log_name",
    "log_records",
    "logs_handler",
    "record_line",
    "scenario_of",
    "time_per_output_token",
]
