"""A minimal ext_proc server standing in for sluicegate.filters in translation e2e tests.

It does just enough of each stage to prove that the generated Envoy config lets the real
filter do its job: the routing stage sets the model header and clears the route cache
(or answers immediately); the attempt stage reads the chosen provider's metadata and
rewrites `:path` and the body's model. It records what Envoy sent, for assertions.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from envoy.type.v3 import http_status_pb2
from google.protobuf import text_format
from google.protobuf.json_format import MessageToDict

from sluicegate import wire

LIMITED_MODEL = "limited"  # routing stage answers 429 itself (immediate response)
EXPLODING_MODEL = "explode"  # routing stage fails the gRPC stream (Envoy answers 500)
SLOW_MODEL = "slow"  # routing stage answers after SLOW_SECONDS (past message_timeout)
SLOW_SECONDS = 1.0


@dataclass
class Seen:
    """One message Envoy sent: the stage, its kind and its attributes as plain dicts."""

    stage: str
    kind: str
    attributes: dict[str, Any] = field(default_factory=dict)


def _header(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode()),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )


class FakeExtProc(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.seen: list[Seen] = []

    async def Process(  # the gRPC method's name
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: Any
    ) -> AsyncIterator[pb.ProcessingResponse]:
        metadata = dict(context.invocation_metadata())
        stage = metadata.get(wire.STAGE_METADATA_KEY, "?")
        # Attributes come with the first message of the stream only.
        attributes: dict[str, Any] = {}
        async for request in request_iterator:
            kind = request.WhichOneof("request")
            # Keyed by filter name, each a Struct of attribute name -> value.
            received: dict[str, Any] = {}
            for values in request.attributes.values():
                received.update(MessageToDict(values))
            attributes.update(received)
            self.seen.append(Seen(stage, kind, received))
            if kind == "request_headers" and stage == wire.STAGE_ATTEMPT:
                yield self._attempt_headers(request.request_headers, attributes)
            elif kind == "request_headers":
                yield pb.ProcessingResponse(request_headers=pb.HeadersResponse())
            elif kind == "request_body":
                if stage == wire.STAGE_ROUTING:
                    response = await self._route(request.request_body.body, context)
                else:
                    response = self._attempt_body(request.request_body.body, attributes)
                yield response
            else:  # anything else: continue unchanged
                yield pb.ProcessingResponse(**{kind: pb.HeadersResponse()})

    async def _route(self, body: bytes, context: Any) -> pb.ProcessingResponse:
        model = json.loads(body).get("model", "")
        if model == SLOW_MODEL:
            await asyncio.sleep(SLOW_SECONDS)
        if model == EXPLODING_MODEL:
            await context.abort(grpc.StatusCode.INTERNAL, "boom")
        if model == LIMITED_MODEL:
            error = {"error": {"message": "slow down", "type": "requests", "param": None,
                               "code": "rate_limit_exceeded"}}  # fmt: skip
            return pb.ProcessingResponse(
                immediate_response=pb.ImmediateResponse(
                    status=http_status_pb2.HttpStatus(code=429),
                    headers=pb.HeaderMutation(
                        set_headers=[_header("content-type", "application/json")]
                    ),
                    body=json.dumps(error).encode(),
                    details="sluicegate_rate_limited",
                )
            )
        return pb.ProcessingResponse(
            request_body=pb.BodyResponse(
                response=pb.CommonResponse(
                    header_mutation=pb.HeaderMutation(
                        set_headers=[_header(wire.MODEL_HEADER, model)]
                    ),
                    clear_route_cache=True,
                )
            )
        )

    def _attempt_headers(
        self, headers: pb.HttpHeaders, attributes: dict[str, Any]
    ) -> pb.ProcessingResponse:
        """Rewrite the route's prefix to the chosen provider's URL prefix."""
        host = _namespace(attributes.get(wire.UPSTREAM_HOST_METADATA_ATTRIBUTE))
        route = _namespace(attributes.get("xds.route_metadata"))
        path = next((h.raw_value.decode() for h in headers.headers.headers if h.key == ":path"), "")
        prefix = route[wire.META_PATH_PREFIX]
        new_path = host[wire.META_PATH_PREFIX] + "/" + path[len(prefix) :]
        return pb.ProcessingResponse(
            request_headers=pb.HeadersResponse(
                response=pb.CommonResponse(
                    header_mutation=pb.HeaderMutation(set_headers=[_header(":path", new_path)])
                )
            )
        )

    def _attempt_body(self, body: bytes, attributes: dict[str, Any]) -> pb.ProcessingResponse:
        """Rename the model as the chosen provider knows it."""
        host = _namespace(attributes.get(wire.UPSTREAM_HOST_METADATA_ATTRIBUTE))
        document = json.loads(body)
        renames = host.get(wire.META_MODEL_MAP, {})
        document["model"] = renames.get(document["model"], document["model"])
        new_body = json.dumps(document).encode()
        return pb.ProcessingResponse(
            request_body=pb.BodyResponse(
                response=pb.CommonResponse(
                    header_mutation=pb.HeaderMutation(
                        set_headers=[_header("content-length", str(len(new_body)))]
                    ),
                    body_mutation=pb.BodyMutation(body=new_body),
                )
            )
        )


def _namespace(metadata: Any) -> dict[str, Any]:
    """The sluicegate namespace of a metadata attribute.

    Envoy 1.40 sends message-typed attributes (xds.*_metadata) as the protobuf *text
    format* of `envoy.config.core.v3.Metadata` inside a string value.
    """
    if not isinstance(metadata, str):
        return {}
    parsed = text_format.Parse(metadata, base_pb2.Metadata())
    if wire.METADATA_NAMESPACE not in parsed.filter_metadata:
        return {}
    return MessageToDict(parsed.filter_metadata[wire.METADATA_NAMESPACE])


async def start(port: int) -> tuple[grpc.aio.Server, FakeExtProc]:
    server = grpc.aio.server()
    servicer = FakeExtProc()
    pb_grpc.add_ExternalProcessorServicer_to_server(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, servicer
