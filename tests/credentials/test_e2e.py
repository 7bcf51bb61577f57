"""Provider keys with a real Envoy 1.40: SDS only, per attempt, rotated without a restart.

The stack is the real one, assembled in this process: the control plane reading a YAML
file and its key files, the ADS server (secrets over SDS on the same stream), the ext_proc
server, the mock providers (each requiring its own key and accepting only its own model
names) and Envoy. Proven here:

1. no key appears in `/config_dump`, also with `?include_eds`; the secrets show as
   `[redacted]`;
2. each provider receives its own key, never the client's, and a keyless provider none;
3. a retry that moves to another provider carries that provider's key and model name,
   and the ext_proc attempt stage never receives a key;
4. a changed key file is picked up on reload and used, with no Envoy restart and
   no change to any cluster.

Retries: the retry settings are another change (issue 3 item 3), which gives model routes
a retry policy by default. So that these proofs do not hang on its defaults, any route
without one gets a minimal policy from `RetryingCache` (5xx, one retry, previous_hosts):
what Envoy needs to move a retry to another host.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.extensions.retry.host.previous_hosts.v3 import previous_hosts_pb2
from google.protobuf import wrappers_pb2

from sluicegate import wire
from sluicegate.config import load_config, resolve_api_keys
from sluicegate.envoy import EnvoyProcess, make_bootstrap
from sluicegate.filters import ExtProcServer
from sluicegate.filters.attempt import AttemptStream
from sluicegate.stack.control_plane import ControlPlane
from sluicegate.stack.mocks import mock_specs
from sluicegate.stack.supervisor import start_children, stop_children
from sluicegate.stack.watcher import watch_files
from sluicegate.xds.server import (
    CLUSTER,
    ROUTE,
    SECRET,
    Snapshot,
    SnapshotCache,
    bound_port,
    serve_ads,
)
from tests.ports import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

CLIENT_KEY = "sk-client-0f1e2d3c"
PREVIOUS_HOSTS = "envoy.retry_host_predicates.previous_hosts"
FIRST_KEYS = {"alpha": "sk-alpha-7c1f9e", "beta": "sk-beta-4b8d2a", "gamma": "sk-gamma-5e6f70"}


class RetryingCache(SnapshotCache):
    """Adds a retry policy to every cluster route without one (see the module doc)."""

    def set_snapshot(self, snapshot: Snapshot, node_id: str | None = None) -> None:
        resources: dict[str, list[Any]] = {}
        for type_url in snapshot.type_urls():
            resources[type_url] = []
            for entry in snapshot.resources(type_url).values():
                message = type(entry.message)()
                message.CopyFrom(entry.message)
                resources[type_url].append(message)
        for config in resources.get(ROUTE, []):
            for host in config.virtual_hosts:
                for route in host.routes:
                    action = route.route
                    if (
                        route.HasField("route")
                        and action.cluster
                        and not action.HasField("retry_policy")
                    ):
                        action.retry_policy.CopyFrom(_retry_policy())
        super().set_snapshot(Snapshot.from_resources(resources), node_id)


def _retry_policy() -> rc.RetryPolicy:
    predicate = rc.RetryPolicy.RetryHostPredicate(name=PREVIOUS_HOSTS)
    predicate.typed_config.Pack(previous_hosts_pb2.PreviousHostsPredicate())
    return rc.RetryPolicy(
        retry_on="5xx",
        num_retries=wrappers_pb2.UInt32Value(value=1),
        retry_host_predicate=[predicate],
        host_selection_retry_max_attempts=5,
    )


def config_text(ports: dict[str, int], listen: int) -> str:
    return f"""
version: 1
listeners: [{{name: main, address: 127.0.0.1, port: {listen}}}]
providers:
  - name: alpha
    base_url: http://127.0.0.1:{ports["alpha"]}/v1
    api_key: {{file: keys/alpha.key}}
    model_map: {{chat: alpha-chat}}
    mock: {{models: [alpha-chat, alpha-only], ttft_ms: 0, itl_ms: 0, output_tokens: 3}}
  - name: beta
    base_url: http://127.0.0.1:{ports["beta"]}/v1
    api_key: {{file: keys/beta.key}}
    mock: {{models: [chat], ttft_ms: 0, itl_ms: 0, output_tokens: 3}}
  - name: plain
    base_url: http://127.0.0.1:{ports["plain"]}/v1
    mock: {{models: [plain-model], ttft_ms: 0, itl_ms: 0, output_tokens: 3}}
  - name: gamma  # no route yet: test_a_new_provider_is_served_with_its_key_at_once adds one
    base_url: http://127.0.0.1:{ports["gamma"]}/v1
    api_key: {{file: keys/gamma.key}}
    mock: {{models: [gamma-model], ttft_ms: 0, itl_ms: 0, output_tokens: 3}}
routes:
  - name: chat
    models: [chat]
    backends: [{{provider: alpha}}, {{provider: beta}}]
  - {{name: only, models: [alpha-only], backends: [{{provider: alpha}}]}}
  - {{name: plain, models: [plain-model], backends: [{{provider: plain}}]}}
"""


@dataclass
class Gateway:
    url: str
    admin: str
    envoy: EnvoyProcess
    plane: ControlPlane
    mocks: dict[str, str]  # provider -> base URL of the mock (for /mock/*)
    keys_dir: Path
    session: aiohttp.ClientSession
    every_key: set[str] = field(default_factory=lambda: set(FIRST_KEYS.values()))
    # Header names of each request_headers message the attempt stage got (ext_proc).
    attempt_headers: list[set[str]] = field(default_factory=list)

    async def chat(self, model: str, **headers: str) -> tuple[int, str, dict[str, Any]]:
        """POST a chat completion as a client with its own key: (status, provider, body)."""
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
        sent = {"authorization": f"Bearer {CLIENT_KEY}", **headers}
        async with self.session.post(self.url, json=body, headers=sent) as response:
            payload = await response.json(content_type=None)
            return response.status, response.headers.get("x-mock-provider", ""), payload

    async def mock_stats(self, provider: str) -> dict[str, Any]:
        async with self.session.get(self.mocks[provider] + "/mock/stats") as response:
            result: dict[str, Any] = await response.json()
            return result

    async def reset_mocks(self) -> None:
        for base in self.mocks.values():
            async with self.session.post(base + "/mock/reset") as response:
                assert response.status == 200

    async def admin_text(self, path: str) -> str:
        async with self.session.get(self.admin + path) as response:
            assert response.status == 200, path
            return await response.text()


@pytest_asyncio.fixture(loop_scope="module", scope="module", params=["sotw", "delta"])
async def gateway(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Gateway]:
    """The whole stack, once per ADS flavour (secrets ride the same stream in both)."""
    tmp = tmp_path_factory.mktemp(f"credentials-{request.param}")
    ports = {name: free_port() for name in ("alpha", "beta", "plain", "gamma")}
    listen = free_port()
    (tmp / "keys").mkdir()
    for name, key in FIRST_KEYS.items():
        (tmp / "keys" / f"{name}.key").write_text(key + "\n")
    path = tmp / "sluicegate.yaml"
    path.write_text(config_text(ports, listen))
    config = load_config(path)
    mocks = await asyncio.to_thread(
        start_children, mock_specs(config, resolve_api_keys(config, path), tmp)
    )
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(stop_children, mocks)
        seen: list[set[str]] = []
        original = AttemptStream._on_headers

        def recording(self: AttemptStream, request: Any) -> bytes:
            seen.append({h.key for h in request.request_headers.headers.headers})
            return original(self, request)

        patcher = pytest.MonkeyPatch()
        stack.callback(patcher.undo)
        patcher.setattr(AttemptStream, "_on_headers", recording)
        cache = RetryingCache()
        ext_proc = ExtProcServer()
        plane = ControlPlane(path, cache, on_model=ext_proc.load)
        assert plane.load().ok
        ads = await serve_ads(cache, "127.0.0.1:0")
        stack.push_async_callback(ads.stop, 0)
        ext_proc_address = await ext_proc.start("127.0.0.1:0")
        stack.push_async_callback(ext_proc.stop, 0)
        bootstrap = make_bootstrap(
            node_id="credentials-e2e",
            cluster="sluicegate",
            xds_address=f"127.0.0.1:{bound_port(ads)}",
            ext_proc_address=ext_proc_address,
            admin_address="127.0.0.1:0",
            ads_mode=request.param,
        )
        envoy = EnvoyProcess(bootstrap, work_dir=tmp / "envoy", concurrency=1)
        await envoy.start()
        stack.push_async_callback(envoy.stop)
        watcher = asyncio.create_task(watch_files(plane.watched_paths, plane.load, 0.05))
        stack.callback(watcher.cancel)
        session = await stack.enter_async_context(
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        )
        gateway = Gateway(
            url=f"http://127.0.0.1:{listen}/v1/chat/completions",
            admin=envoy.admin_url,
            envoy=envoy,
            plane=plane,
            mocks={name: f"http://127.0.0.1:{port}" for name, port in ports.items()},
            keys_dir=tmp / "keys",
            session=session,
            attempt_headers=seen,
        )
        await _wait_serving(gateway)
        yield gateway


async def _wait_serving(gateway: Gateway) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(aiohttp.ClientError, ValueError):
            status, _, _ = await gateway.chat("plain-model")
            if status == 200:
                return
        await asyncio.sleep(0.1)
    raise AssertionError("the gateway did not serve within 30 s:\n" + gateway.envoy.log_tail())


# ----- 1. keys never in Envoy's config ------------------------------------------------------


@pytest.mark.parametrize("path", ["/config_dump", "/config_dump?include_eds"])
async def test_no_key_in_config_dump(gateway: Gateway, path: str) -> None:
    text = await gateway.admin_text(path)
    for key in gateway.every_key | {CLIENT_KEY}:
        assert key not in text
    # No credential header's value; only the fast lane's 401 words ("Authorization:
    # Bearer YOUR_KEY") may name the scheme.
    assert re.search(r"Bearer (?!YOUR_KEY')", text) is None
    secrets = [
        config
        for config in json.loads(text)["configs"]
        if config["@type"].endswith("SecretsConfigDump")
    ]
    active = {
        item["name"]: item["secret"]["generic_secret"]["secret"]
        for config in secrets
        for item in config.get("dynamic_active_secrets", [])
    }
    assert active == {
        "sluicegate-key-alpha": {"inline_string": "[redacted]"},
        "sluicegate-key-beta": {"inline_string": "[redacted]"},
    }
    if "include_eds" in path:  # the endpoints are there, with the provider but no key
        assert '"provider": "alpha"' in text or '"provider":"alpha"' in text


# ----- 2. each provider its own key, never the client's -------------------------------------


async def test_each_provider_gets_its_own_key_and_never_the_clients(gateway: Gateway) -> None:
    await gateway.reset_mocks()
    served: dict[str, int] = {}
    for _ in range(12):
        status, provider, body = await gateway.chat("chat")
        # A mock answers 401 unless Authorization is exactly `Bearer <its key>`, so a 200
        # proves the right key, and that the client's key was not what it got.
        assert status == 200, body
        served[provider] = served.get(provider, 0) + 1
    assert set(served) == {"alpha", "beta"}  # both providers, each with its own key
    alpha, beta = await gateway.mock_stats("alpha"), await gateway.mock_stats("beta")
    assert alpha["by_model"] == {"alpha-chat": served["alpha"]}
    assert beta["by_model"] == {"chat": served["beta"]}

    status, provider, body = await gateway.chat("plain-model")
    assert (status, provider) == (200, "plain"), body
    plain = await gateway.mock_stats("plain")
    assert [r["authorization_present"] for r in plain["recent_requests"]] == [False]


# ----- 3. a retry to another provider: that provider's key and model name ---------------------


@pytest.mark.parametrize(
    ("failing", "other", "other_model"),
    [("alpha", "beta", "chat"), ("beta", "alpha", "alpha-chat")],
)
async def test_retry_to_another_provider_carries_its_key_and_model(
    gateway: Gateway, failing: str, other: str, other_model: str
) -> None:
    own_model = {"alpha": "alpha-chat", "beta": "chat"}[failing]
    for _ in range(40):  # until the balancer tries the failing provider first
        await gateway.reset_mocks()
        del gateway.attempt_headers[:]
        status, provider, body = await gateway.chat(
            "chat", **{"x-mock-fault": "503", "x-mock-fault-provider": failing}
        )
        assert (status, provider) == (200, other), body
        first = (await gateway.mock_stats(failing))["recent_requests"]
        if not first:
            continue  # the first attempt went to `other`: no retry happened
        # The failing provider checks the key before faulting: a 503 (not a 401) proves the
        # first attempt carried its key; it also got its own model name.
        assert [(r["status"], r["fault"], r["model"]) for r in first] == [(503, "503", own_model)]
        retried = (await gateway.mock_stats(other))["recent_requests"]
        assert [(r["status"], r["model"]) for r in retried] == [(200, other_model)]
        # The attempt stage (model_map) ran for both attempts and never saw a key, not
        # even the first provider's on the header map the retry reuses.
        assert len(gateway.attempt_headers) == 2
        assert all("authorization" not in names for names in gateway.attempt_headers)
        assert all(wire.PROVIDER_HEADER in names for names in gateway.attempt_headers)
        return
    raise AssertionError(f"{failing} was never tried first in 40 requests")


# ----- a new provider: Envoy holds its cluster until the secret is there ------------------


async def test_a_new_provider_is_served_with_its_key_at_once(gateway: Gateway) -> None:
    """A reload adding a route to a new keyed provider pushes a new cluster naming a new
    secret. Envoy subscribes to the secret when it sees the cluster and keeps the cluster
    warming until the secret arrives, so no request goes out without the key (or gets
    Envoy's 401 for a missing credential) while the change lands."""
    assert (await gateway.chat("gamma-model"))[0] == 404  # not routed yet
    text = gateway.plane.path.read_text() + (
        "  - {name: gamma, models: [gamma-model], backends: [{provider: gamma}]}\n"
    )
    replacement = gateway.plane.path.with_suffix(".new")
    replacement.write_text(text)
    os.replace(replacement, gateway.plane.path)
    started = time.monotonic()
    statuses = []
    while True:
        status, provider, body = await gateway.chat("gamma-model")
        statuses.append(status)
        if status == 200:
            break
        assert status == 404, body  # before Envoy has the route: never 401 or 503
        assert time.monotonic() - started < 10, "the new route was not served within 10 s"
        await asyncio.sleep(0.005)
    assert provider == "gamma"
    stats = (await gateway.mock_stats("gamma"))["by_status"]
    assert stats == {"200": 1}  # the mock saw exactly one request, with its key


# ----- 4. rotation: a changed key file is used after reload, without restart -----------------


async def test_rotated_key_file_is_used_without_restarting_envoy(gateway: Gateway) -> None:
    pid = gateway.envoy.pid
    assert gateway.plane.snapshot is not None
    clusters_before = gateway.plane.snapshot.version(CLUSTER)
    assert (await gateway.chat("alpha-only"))[0] == 200
    new_key = "sk-alpha-rotated-93ad"
    gateway.every_key.add(new_key)
    # The provider switches to the new key first (a real one accepts both for a while).
    async with gateway.session.post(
        gateway.mocks["alpha"] + "/mock/config", json={"api_key": new_key}
    ) as response:
        assert response.status == 200
    assert (await gateway.chat("alpha-only"))[0] == 401  # Envoy still sends the old key

    # Only the key file changes (not the YAML), renamed over the old one.
    replacement = gateway.keys_dir / "alpha.key.new"
    replacement.write_text(new_key + "\n")
    os.replace(replacement, gateway.keys_dir / "alpha.key")
    started = time.monotonic()
    while True:
        status, provider, body = await gateway.chat("alpha-only")
        if status == 200:
            break
        assert status == 401, body
        assert time.monotonic() - started < 10, "the rotated key was not used within 10 s"
        await asyncio.sleep(0.05)
    assert provider == "alpha"
    assert gateway.envoy.pid == pid and gateway.envoy.running  # no restart
    outcome = gateway.plane.last_outcome
    assert outcome is not None and outcome.ok and outcome.changed_types == [SECRET]
    assert gateway.plane.snapshot is not None
    assert gateway.plane.snapshot.version(CLUSTER) == clusters_before
    # The other provider's key and the retry path still work; no key in the dump.
    fault = {"x-mock-fault": "503", "x-mock-fault-provider": "beta"}
    status, _, body = await gateway.chat("chat", **fault)
    assert status == 200, body
    for path in ("/config_dump", "/config_dump?include_eds"):
        text = await gateway.admin_text(path)
        assert all(key not in text for key in gateway.every_key)
