"""With no ext_proc server reachable, a client gets OpenAI's 503 with Retry-After, never
a 500 (issue 9, part 1).

`sluicegate up --no-envoy` serves xDS; an Envoy started here takes its config from it
but is bootstrapped with ext_proc servers where nothing listens, as a sidecar's Envoy
would be when every ext_proc server is down. The ext_proc filter then fails with gRPC
UNAVAILABLE (details `ext_proc_error_gRPC_error_14{…}`), which the listener's
local_reply_config must answer as 503 `ext_proc_unavailable` with Retry-After.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from sluicegate.envoy import EnvoyProcess, make_bootstrap
from sluicegate.testing import quickstart_on_free_ports, wait_until
from tests.ports import free_ports

pytestmark = pytest.mark.e2e


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[str]:
    doc = quickstart_on_free_ports(tmp_path)
    config = tmp_path / "sluicegate.yaml"
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    with (tmp_path / "up.log").open("wb") as log:
        up = subprocess.Popen(
            [sys.executable, "-m", "sluicegate", "up", str(config), "--no-envoy",
             "--work-dir", str(tmp_path / "work")],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        status = "http://" + doc["sluicegate"]["http"] + "/healthz"

        def serving() -> bool:
            assert up.poll() is None, (tmp_path / "up.log").read_text()
            try:
                with urllib.request.urlopen(status, timeout=2):
                    return True
            except OSError:
                return False

        assert wait_until(serving, 30)
        nowhere = [f"127.0.0.1:{port}" for port in free_ports(2)]
        bootstrap = make_bootstrap("no-ext-proc", "sluicegate", doc["sluicegate"]["xds"],
                                   nowhere, "127.0.0.1:0")  # fmt: skip
        with EnvoyProcess(bootstrap, work_dir=tmp_path / "envoy", concurrency=1):
            listener = doc["listeners"][0]
            yield f"http://{listener['address']}:{listener['port']}"
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(20)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()


def post(url: str) -> tuple[int, dict[str, str], bytes]:
    body = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        body.encode(),
        {"content-type": "application/json", "authorization": "Bearer sk-sluicegate-demo"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def test_no_reachable_ext_proc_server_is_a_503_with_retry_after(gateway: str) -> None:
    # Until Envoy has its listener from xDS the port refuses; then every answer counts.
    def answered() -> bool:
        try:
            post(gateway)
            return True
        except OSError:
            time.sleep(0.1)
            return False

    assert wait_until(answered, 30)
    for _ in range(5):
        status, headers, body = post(gateway)
        assert status == 503, (status, body)
        assert int(headers["retry-after"]) >= 1
        assert headers["content-type"] == "application/json"
        error = json.loads(body)["error"]
        assert error["type"] == "server_error"
        assert error["code"] == "ext_proc_unavailable", error
