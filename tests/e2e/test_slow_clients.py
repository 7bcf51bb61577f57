"""Slow and abusive clients are cut off by a real Envoy (`limits:`), while ordinary
requests and long streams are not (issue 9, part 5)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest
from openai import OpenAI

from tests.e2e.stack import Stack, own_addresses, running_stack
from tests.ports import free_ports

pytestmark = pytest.mark.e2e

HELLO: Any = [{"role": "user", "content": "hello"}]
MAX_CONNECTIONS = 8
# Generous: the timeouts below are 1 s (request_timeout plus the 2 s queue margin and the
# 1 s ext_proc timeout: 4 s); without them nothing would close for Envoy's hour.
CLOSED_WITHIN_S = 30.0


def _doc() -> dict[str, Any]:
    listener_port, mock_port = free_ports(2)
    return {
        "version": 1,
        "sluicegate": own_addresses(),
        "limits": {
            "request_headers_timeout": "1s",
            "request_timeout": "1s",
            "ext_proc_message_timeout_ms": 1000,
            "max_connections_per_listener": MAX_CONNECTIONS,
        },
        "listeners": [{"name": "main", "address": "127.0.0.1", "port": listener_port}],
        "providers": [
            {
                "name": "mock",
                "base_url": f"http://127.0.0.1:{mock_port}/v1",
                "mock": {"ttft_ms": 0, "itl_ms": 0, "jitter_ms": 0, "output_tokens": 1},
            }
        ],
        "routes": [{"name": "chat", "models": ["m"], "backends": [{"provider": "mock"}]}],
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("slow"), _doc()) as running:
        yield running


def _connect(stack: Stack) -> socket.socket:
    host, port = stack.gateway.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.settimeout(0.2)
    return sock


def _read_until_closed(sock: socket.socket, trickle: bytes, deadline_s: float) -> bytes | None:
    """Send `trickle` a byte at a time (a slow client) while reading; what the gateway
    sent before closing, or None if it was still open at the deadline."""
    received = b""
    deadline = time.monotonic() + deadline_s
    position = 0
    while time.monotonic() < deadline:
        if position < len(trickle):
            try:
                sock.sendall(trickle[position : position + 1])
            except OSError:  # closed by the gateway
                return received
            position += 1
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk
    return None


def _assert_openai_408(answer: bytes) -> None:
    """Envoy answers a request cut off by a request timer with a 408, then closes."""
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer
    error = json.loads(body)["error"]
    assert error["code"] == "request_timeout", error


def test_slowloris_headers_are_cut_off(stack: Stack) -> None:
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
    endless = head + b"x-slow: " + b"a" * 100_000  # headers that never end
    with ExitStack() as held:
        socks = [held.enter_context(_connect(stack)) for _ in range(3)]
        for sock in socks:
            sock.sendall(head)
        for sock in socks:
            answer = _read_until_closed(sock, endless[len(head) :], CLOSED_WITHIN_S)
            assert answer is not None, "a slowloris connection was still open"
            _assert_openai_408(answer)


def test_slow_body_is_cut_off(stack: Stack) -> None:
    body = json.dumps({"model": "m", "messages": HELLO}).encode() * 100
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    with _connect(stack) as sock:
        sock.sendall(head)
        answer = _read_until_closed(sock, body, CLOSED_WITHIN_S)
        assert answer is not None, "a slow-body connection was still open"
        _assert_openai_408(answer)


def _models(sock: socket.socket) -> bytes:
    """One keep-alive GET /v1/models; its answer's status line (b"" if closed)."""
    sock.settimeout(5)
    try:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: gw\r\n\r\n")
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            if not chunk:
                return b""
            answer += chunk
    except (ConnectionResetError, BrokenPipeError):
        return b""
    head = answer.partition(b"\r\n\r\n")[0]
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    body = answer.partition(b"\r\n\r\n")[2]
    while len(body) < length:
        body += sock.recv(65536)
    return head.split(b"\r\n")[0]


@contextmanager
def _held(stack: Stack, count: int) -> Iterator[list[socket.socket]]:
    with ExitStack() as held:
        socks = [held.enter_context(_connect(stack)) for _ in range(count)]
        yield socks


def test_connections_over_the_listener_limit_are_refused(stack: Stack) -> None:
    with _held(stack, MAX_CONNECTIONS) as socks:
        # Each held connection is served, so Envoy has accepted every one of them.
        for sock in socks:
            assert _models(sock) == b"HTTP/1.1 200 OK"
        with _connect(stack) as extra:
            assert _models(extra) == b""
    # Below the limit again (Envoy counts a close once it sees it): served.
    deadline = time.monotonic() + CLOSED_WITHIN_S
    status = b""
    while status != b"HTTP/1.1 200 OK" and time.monotonic() < deadline:
        with _connect(stack) as sock:
            status = _models(sock)
    assert status == b"HTTP/1.1 200 OK"


def test_ordinary_request_and_long_stream_still_work(stack: Stack) -> None:
    sdk = OpenAI(base_url=stack.gateway + "/v1", api_key="unused", max_retries=0)
    answer = sdk.chat.completions.create(model="m", messages=HELLO)
    assert answer.choices[0].message.content
    # 80 tokens 100 ms apart: longer than every request timer (4 s at most), which Envoy
    # disarms once the request is in.
    stream = sdk.chat.completions.create(
        model="m", messages=HELLO, stream=True,
        extra_headers={"x-mock-output-tokens": "80", "x-mock-itl-ms": "100"},
    )  # fmt: skip
    tokens = sum(1 for chunk in stream if chunk.choices and chunk.choices[0].delta.content)
    assert tokens == 80


def test_slow_clients_leave_the_gateway_serving(stack: Stack) -> None:
    """After the floods above, the gateway still answers."""
    with _connect(stack) as sock:
        assert _models(sock) == b"HTTP/1.1 200 OK"
