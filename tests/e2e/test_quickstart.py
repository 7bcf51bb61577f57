"""The quickstart, end to end: `sluicegate up` with a real Envoy, the official OpenAI SDK.

The tests that only send requests share one stack on free ports; those that edit or
restart one start their own. `running_stack` asserts that SIGTERM leaves no process
behind.
"""

from __future__ import annotations

import copy
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from sluicegate.testing import EXAMPLES, alive, children_of, quickstart_on_free_ports
from tests.e2e.stack import Stack, holding_quickstart_addresses, running_stack

pytestmark = pytest.mark.e2e

DEMO_KEY = "sk-sluicegate-demo"
HELLO: Any = [{"role": "user", "content": "hello"}]


def client(stack: Stack) -> OpenAI:
    return OpenAI(base_url=stack.gateway + "/v1", api_key=DEMO_KEY, max_retries=0, timeout=20)


def post_raw(stack: Stack, body: bytes, path: str = "/v1/chat/completions") -> tuple[int, dict[str, Any], dict[str, str]]:  # noqa: E501
    request = urllib.request.Request(
        stack.gateway + path, data=body, method="POST",
        headers={"content-type": "application/json", "authorization": f"Bearer {DEMO_KEY}"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.load(response), dict(response.headers)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), dict(err.headers)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One quickstart for the tests that only send it requests (each stack costs seconds
    to start and stop); the tests that edit or restart one start their own."""
    tmp_path = tmp_path_factory.mktemp("quickstart")
    with running_stack(tmp_path, quickstart_on_free_ports(tmp_path)) as running:
        yield running


def test_sdk_chat_json_and_stream(stack: Stack) -> None:
    sdk = client(stack)
    reply = sdk.chat.completions.create(
        model="qwen-plus", messages=[{"role": "user", "content": "hello"}]
    )
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.completion_tokens > 0

    arrivals: list[float] = []
    pieces: list[str] = []
    stream = sdk.chat.completions.create(
        model="qwen-plus", messages=[{"role": "user", "content": "hello"}], stream=True,
        extra_headers={"x-mock-output-tokens": "20", "x-mock-itl-ms": "30"},
    )  # fmt: skip
    for chunk in stream:
        arrivals.append(time.monotonic())
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
    assert len(pieces) == 20
    # 19 gaps of 30 ms: a buffered response would arrive in one burst.
    assert arrivals[-1] - arrivals[0] > 0.3


def test_the_demo_tenant_is_envoys_but_for_the_gated_model(stack: Stack) -> None:
    """The quickstart's `lane: auto` (docs/fast-lane.md): far from its limits, the demo
    tenant's requests are decided by Envoy alone, with its token buckets' headers; those
    for gpt-4o-mini, whose route has a gate, take the routing stage, with OpenAI's."""
    before = stack.routing_stage_streams()
    status, _, headers = post_raw(
        stack, json.dumps({"model": "qwen-plus", "messages": HELLO}).encode()
    )
    assert status == 200
    assert stack.routing_stage_streams() == before
    assert "x-ratelimit-limit" in headers and "x-ratelimit-limit-requests" not in headers
    status, _, headers = post_raw(
        stack, json.dumps({"model": "gpt-4o-mini", "messages": HELLO}).encode()
    )
    assert status == 200
    assert stack.routing_stage_streams() == before + 1
    assert headers["x-ratelimit-limit-requests"] == "600"
    # The client Envoy's key check named goes no further than the gateway.
    assert "x-sluicegate-client" not in stack.last_request_to(headers["x-mock-provider"])["headers"]


def test_models_endpoint_lists_served_models(stack: Stack) -> None:
    ids = {model.id for model in client(stack).models.list()}
    assert ids == {"gpt-4o-mini", "qwen-plus", "deepseek-chat"}


def test_weighted_providers_and_per_provider_model_names(stack: Stack) -> None:
    sdk = client(stack)
    seen: dict[str, int] = {}
    for _ in range(40):
        raw = sdk.chat.completions.with_raw_response.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}],
            extra_headers={"x-mock-output-tokens": "1", "x-mock-ttft-ms": "0"},
        )  # fmt: skip
        provider = raw.headers["x-mock-provider"]
        seen[provider] = seen.get(provider, 0) + 1
        # alpha knows the model by another name (model_map); beta by the client's name.
        expected = {"alpha": "alpha-mini", "beta": "gpt-4o-mini"}[provider]
        assert raw.parse().model == expected
    assert set(seen) == {"alpha", "beta"}
    assert 24 <= seen["alpha"] <= 36, seen  # weights 3:1 over 40 requests


def test_bad_requests_get_openai_errors(stack: Stack) -> None:
    status, body, headers = post_raw(stack, b"{not json")
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    assert headers["content-type"].startswith("application/json")
    status, body, _ = post_raw(stack, b'{"messages": []}')
    assert status == 400 and "model" in body["error"]["message"]
    status, body, _ = post_raw(stack, b'{"model": "no-such-model", "messages": []}')
    assert status == 404 and body["error"]["code"] == "model_not_found"
    status, body, _ = post_raw(stack, b'{"model": "qwen-plus"}', path="/v2/unknown")
    assert status == 404 and "error" in body


def _wait_until(predicate: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def _served(stack: Stack) -> set[str]:
    request = urllib.request.Request(
        stack.gateway + "/v1/models", headers={"authorization": f"Bearer {DEMO_KEY}"}
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return {m["id"] for m in json.load(response)["data"]}


def test_hot_reload_keeps_streams_and_rejects_bad_edits(tmp_path: Path) -> None:
    doc = quickstart_on_free_ports(tmp_path)
    for provider in doc["providers"]:
        provider["mock"]["models"] = []  # accept any model, so edits can add some
    with running_stack(tmp_path, doc) as stack:
        sdk = client(stack)
        finished: list[int] = []

        def long_stream() -> None:
            stream = sdk.chat.completions.create(
                model="deepseek-chat", messages=[{"role": "user", "content": "x"}], stream=True,
                extra_headers={"x-mock-output-tokens": "60", "x-mock-itl-ms": "25"},
            )  # fmt: skip
            finished.append(sum(1 for c in stream if c.choices and c.choices[0].delta.content))

        streamer = threading.Thread(target=long_stream)
        streamer.start()
        time.sleep(0.3)
        edited = copy.deepcopy(doc)
        edited["routes"].append(
            {"name": "glm", "models": ["glm-4"], "backends": [{"provider": "beta"}]}
        )
        stack.write(edited)
        _wait_until(lambda: "glm-4" in _served(stack))
        reply = sdk.chat.completions.create(model="glm-4", messages=HELLO)
        assert reply.choices[0].message.content
        streamer.join(15)
        assert finished == [60], "a stream in flight was cut by the reload"

        # An invalid edit is rejected with file:line and the last good config keeps serving.
        stack.write_text(stack.config_path.read_text().replace("weight: 3", "weight: lots"))
        _wait_until(lambda: stack.status()["last_reload"]["ok"] is False)
        problems = stack.status()["last_reload"]["problems"]
        assert any("sluicegate.yaml:" in p and "weight" in p for p in problems), problems
        reply = sdk.chat.completions.create(model="glm-4", messages=HELLO)
        assert reply.choices[0].message.content
        assert "glm-4" in _served(stack)


def test_delta_xds_mode_serves_and_reloads(tmp_path: Path) -> None:
    doc = quickstart_on_free_ports(tmp_path)
    with running_stack(tmp_path, doc, "--ads-mode", "delta") as stack:
        sdk = client(stack)
        assert sdk.chat.completions.create(
            model="deepseek-chat", messages=[{"role": "user", "content": "x"}]
        ).choices
        edited = copy.deepcopy(doc)
        edited["routes"] = [r for r in edited["routes"] if r["name"] != "qwen"]
        stack.write(edited)
        _wait_until(lambda: "qwen-plus" not in _served(stack))
        status, body, _ = post_raw(stack, b'{"model": "qwen-plus", "messages": []}')
        assert status == 404 and body["error"]["code"] == "model_not_found"
        nodes = stack.status()["nodes"]
        assert nodes and all(not any(n.get("nacks", {}).values()) for n in nodes)


def chat_body(model: str, content: str) -> str:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": content}]})


def test_body_over_the_limit_gets_413_json(tmp_path: Path) -> None:
    doc = quickstart_on_free_ports(tmp_path)
    doc["limits"]["max_request_body_bytes"] = 64 * 1024
    with running_stack(tmp_path, doc) as stack:
        padding = "x" * (100 * 1024)
        body = chat_body("qwen-plus", padding)
        status, answer, headers = post_raw(stack, body.encode())
        assert status == 413, answer
        assert answer["error"]["code"] and headers["content-type"].startswith("application/json")
        # Just under the limit still goes through.
        small = chat_body("qwen-plus", "x" * 1000)
        status, answer, _ = post_raw(stack, small.encode())
        assert status == 200, answer


def test_status_command_reports_nodes(stack: Stack) -> None:
    address = stack.doc["sluicegate"]["http"]
    result = subprocess.run(
        [sys.executable, "-m", "sluicegate", "status", "--json", "--address", address],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    document = json.loads(result.stdout)
    assert document["last_reload"]["ok"] is True
    assert [n["node_id"] for n in document["nodes"]] == ["sluicegate-gateway"]
    assert set(document["models"]) == {"gpt-4o-mini", "qwen-plus", "deepseek-chat"}


def test_a_settled_envoy_is_not_shown_behind(stack: Stack) -> None:
    """Once its pushes are ACKed, the node holds what it is served, type by type, and the
    text shows no "(serving ...)": before f73b945 its filter configs (ECDS) showed it
    behind for ever, compared with a snapshot version that also hashed Envoy's own
    filters beside the native library's (docs/operations.md, "Status and metrics")."""
    deadline = time.monotonic() + 15
    while True:
        (node,) = stack.status()["nodes"]
        if node["acked"] == node["serving"] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert node["acked"] == node["serving"], node
    assert any("TypedExtensionConfig" in type_url for type_url in node["acked"]), node
    result = subprocess.run(
        [sys.executable, "-m", "sluicegate", "status", "--address",
         stack.doc["sluicegate"]["http"]],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert "TypedExtensionConfig" in result.stdout and "(serving" not in result.stdout, (
        result.stdout
    )


def _ports_free(ports: list[int]) -> bool:
    for port in ports:
        with socket.socket() as probe:
            # REUSEADDR: connections in TIME_WAIT do not make a port busy for a server.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def test_the_quickstart_file_itself_on_its_documented_addresses(tmp_path: Path) -> None:
    """`sluicegate up examples/quickstart.yaml` unchanged; Ctrl-C (SIGINT) stops everything."""
    with holding_quickstart_addresses():
        _the_quickstart_file_itself(tmp_path)


def _the_quickstart_file_itself(tmp_path: Path) -> None:
    ports = [10000, 9901, 18000, 18001, 9100, 18081, 18082]
    if not _ports_free(ports):
        pytest.skip("a quickstart port is taken on this machine")
    log_path = tmp_path / "up.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "sluicegate", "up", str(EXAMPLES / "quickstart.yaml"),
             "--work-dir", str(tmp_path / "work")],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, log_path.read_text()
            try:
                sdk = OpenAI(base_url="http://127.0.0.1:10000/v1", api_key=DEMO_KEY, max_retries=0)
                reply = sdk.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        assert reply.choices[0].message.content
        with urllib.request.urlopen("http://127.0.0.1:9901/ready", timeout=5) as ready:
            assert ready.read().strip() == b"LIVE"
        with urllib.request.urlopen("http://127.0.0.1:9100/metrics", timeout=5) as metrics:
            assert b"sluicegate_config_reloads_total" in metrics.read()
        children = children_of(process.pid)
        assert len(children) >= 3  # two mock providers and Envoy
    finally:
        children = children_of(process.pid)
        process.send_signal(signal.SIGINT)
        process.wait(20)
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in children if alive(pid)], "Ctrl-C left processes running"
    assert _ports_free(ports)
