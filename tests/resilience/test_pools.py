"""Connection pools and upstream TLS, end to end: `sluicegate up` with a real Envoy.

- many sequential requests share one upstream connection (Envoy's upstream_cx_total and
  the mock's connections_total both stay 1), over plain HTTP and over TLS;
- TLS is verified: against a CA made here (ca_file), the SNI name must be in the
  certificate, and the system CA bundle (the default) does not trust the test CA;
- a request over a pool limit gets an OpenAI-style 503 `upstream_overflow` at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import pytest

from sluicegate.provider.thread import ThreadedMockProvider
from tests.e2e.stack import Stack

from .harness import (
    HELLO,
    client,
    document,
    gateway,
    make_test_ca,
    mock,
    mocks,
    post,
    post_stream,
    stats,
)

pytestmark = pytest.mark.e2e

SERVER_NAME = "mock.sluicegate.test"


@dataclass
class Setup:
    stack: Stack
    mocks: dict[str, ThreadedMockProvider]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp: Path = tmp_path_factory.mktemp("pools")
    ca, cert, key = make_test_ca(tmp, SERVER_NAME)
    with (
        mocks("plain", "slow") as running,
        closing(mock("secure", tls_cert=str(cert), tls_key=str(key))) as secure,
    ):
        tls_url = f"https://127.0.0.1:{secure.port}/v1"
        providers = [
            {"name": "plain", "base_url": f"http://127.0.0.1:{running['plain'].port}/v1"},
            {"name": "slow", "base_url": f"http://127.0.0.1:{running['slow'].port}/v1"},
            # The IP literal in the URL is where to connect; SNI and the name checked in
            # the certificate come from tls.sni.
            {"name": "secure", "base_url": tls_url,
             "tls": {"sni": SERVER_NAME, "ca_file": str(ca)}},
            {"name": "untrusted", "base_url": tls_url, "tls": {"sni": SERVER_NAME}},
            {"name": "wrong-name", "base_url": tls_url,
             "tls": {"sni": "other.sluicegate.test", "ca_file": str(ca)}},
        ]  # fmt: skip
        no_retries = {"max_retries": 0}
        routes = [
            {"name": "pooled", "models": ["pooled"], "backends": [{"provider": "plain"}]},
            {"name": "tls", "models": ["tls"], "backends": [{"provider": "secure"}]},
            {"name": "untrusted", "models": ["untrusted"], "retries": no_retries,
             "backends": [{"provider": "untrusted"}]},
            {"name": "wrong-name", "models": ["wrong-name"], "retries": no_retries,
             "backends": [{"provider": "wrong-name"}]},
            {"name": "small", "models": ["small"], "retries": no_retries,
             "pool": {"max_connections": 1, "max_pending_requests": 1},
             "backends": [{"provider": "slow"}]},
        ]  # fmt: skip
        with gateway(tmp, document(providers, routes)) as stack:
            yield Setup(stack, {**running, "secure": secure})


def test_sequential_requests_reuse_one_upstream_connection(setup: Setup) -> None:
    for _ in range(20):
        assert post(setup.stack, "pooled").status == 200
    assert stats(setup.stack, "route-pooled")["upstream_cx_total"] == 1
    assert setup.mocks["plain"].stats()["connections_total"] == 1


def test_tls_provider_verified_with_a_test_ca_and_kept_alive(setup: Setup) -> None:
    sdk = client(setup.stack)
    for _ in range(10):
        assert sdk.chat.completions.create(model="tls", messages=HELLO).choices
        # A stream read to its very end. (The sync SDK stops reading at `data: [DONE]` and
        # closes; if that beats the provider's last chunk to Envoy, Envoy resets the
        # attempt and an HTTP/1.1 provider connection cannot be reused.)
        body = post_stream(setup.stack, "tls")
        assert body.endswith(b"data: [DONE]\n\n")
    counters = stats(setup.stack, "route-tls")
    assert counters["upstream_cx_total"] == 1
    assert counters["ssl.handshake"] == 1
    assert setup.mocks["secure"].stats()["connections_total"] == 1
    chunks = list(sdk.chat.completions.create(model="tls", messages=HELLO, stream=True))
    assert [c for c in chunks if c.choices and c.choices[0].delta.content]


@pytest.mark.parametrize(
    ("model", "failure", "stat"),
    [
        # The default CA bundle (the system's) does not know the test CA.
        ("untrusted", "unable_to_get_local_issuer_certificate", "ssl.fail_verify_error"),
        # Signed by the right CA, but for another name than the provider's SNI.
        ("wrong-name", "SAN_matcher", "ssl.fail_verify_san"),
    ],
)
def test_tls_provider_not_trusted_or_wrong_name_is_refused(
    setup: Setup, model: str, failure: str, stat: str
) -> None:
    before = setup.mocks["secure"].stats()["requests_total"]
    answer = post(setup.stack, model)
    assert answer.status == 503, answer.body
    assert answer.body["error"]["code"] == "upstream_connect_error"
    assert "CERTIFICATE_VERIFY_FAILED" in answer.body["error"]["message"]
    assert failure in answer.body["error"]["message"]
    assert stats(setup.stack, f"route-{model}")[stat] == 1
    assert setup.mocks["secure"].stats()["requests_total"] == before  # nothing got through


def test_pool_overflow_is_an_immediate_openai_503(setup: Setup) -> None:
    """One connection and one waiting request allowed: the third concurrent one overflows."""
    slow = {"x-mock-ttft-ms": "800"}
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(post, setup.stack, "small", slow)
        time.sleep(0.2)
        second = pool.submit(post, setup.stack, "small", slow)
        time.sleep(0.2)
        third = pool.submit(post, setup.stack, "small", slow)
        overflow = third.result(timeout=10)
        assert overflow.status == 503, overflow.body
        assert overflow.body["error"]["code"] == "upstream_overflow"
        assert overflow.body["error"]["type"] == "server_error"
        assert overflow.headers["retry-after"] == "1"
        assert overflow.headers["x-sluicegate-refusal"] == "upstream_overflow"
        assert overflow.headers["content-type"].startswith("application/json")
        assert overflow.seconds < 0.5, "an overflow must be answered at once, not queued"
        assert first.result(timeout=10).status == 200
        assert second.result(timeout=10).status == 200
    assert stats(setup.stack, "route-small")["upstream_rq_pending_overflow"] == 1
