"""LogsService.Export over real gRPC, as Envoy's OpenTelemetry access log calls it."""

from __future__ import annotations

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from prometheus_client import CollectorRegistry

from sluicegate.records import LOGS_METHOD_NAME, LOGS_SERVICE_NAME, RecordSink, logs_handler

from .helpers import export_of, gateway, log_record, streamed


async def test_export_feeds_the_sink_and_answers_empty() -> None:
    registry = CollectorRegistry()
    sink = RecordSink(registry)
    sink.load(gateway())
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((logs_handler(sink),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            export = channel.unary_unary(
                f"/{LOGS_SERVICE_NAME}/{LOGS_METHOD_NAME}",
                request_serializer=logs_service_pb2.ExportLogsServiceRequest.SerializeToString,
                response_deserializer=logs_service_pb2.ExportLogsServiceResponse.FromString,
            )
            answer = await export(export_of(log_record(streamed()), log_record({})), timeout=5)
            assert answer == logs_service_pb2.ExportLogsServiceResponse()
            # A batch that is not what Envoy sends still gets an answer.
            await export(logs_service_pb2.ExportLogsServiceRequest(), timeout=5)
    finally:
        await server.stop(None)
    total = sum(
        sample.value
        for metric in registry.collect()
        if metric.name == "sluicegate_requests"
        for sample in metric.samples
        if sample.name == "sluicegate_requests_total"
    )
    assert total == 2
