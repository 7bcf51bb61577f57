"""Envoy's admin on a Unix socket (issue 9, part 7): whoever reaches the admin can turn
on debug logging, and Envoy's debug log prints keys. `sluicegate.envoy_admin:
unix:/path` makes the bootstrap a pipe of mode 0600, everything sluicegate does with the
admin works over it, and `up` then opens no TCP admin port."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml
from envoy.config.bootstrap.v3 import bootstrap_pb2
from envoy.config.core.v3 import address_pb2
from openai import OpenAI

from sluicegate.envoy import (
    EnvoyProcess,
    admin_get,
    admin_json,
    bootstrap_dict,
    flatten_stats,
    make_bootstrap,
)
from sluicegate.testing import children_of, quickstart_on_free_ports
from tests.e2e.stack import running_stack

from .conftest import closed_port, envoy_validate

pytestmark = pytest.mark.timeout(90)


def bootstrap_with_admin(admin_address: str) -> bootstrap_pb2.Bootstrap:
    port = closed_port()  # no control plane: the admin is all these tests need
    return make_bootstrap(
        node_id="admin-test",
        cluster="sluicegate",
        xds_address=f"127.0.0.1:{port}",
        ext_proc_address=f"127.0.0.1:{port}",
        admin_address=admin_address,
        initial_fetch_timeout_s=0.5,
    )


def test_a_unix_admin_is_a_pipe_only_its_user_may_open(tmp_path: Path) -> None:
    bootstrap = bootstrap_with_admin(f"unix:{tmp_path}/admin.sock")
    address = bootstrap.admin.address
    assert address.WhichOneof("address") == "pipe"
    assert address.pipe == address_pb2.Pipe(path=f"{tmp_path}/admin.sock", mode=0o600)
    config = tmp_path / "bootstrap.yaml"
    config.write_text(yaml.safe_dump(bootstrap_dict(bootstrap)))
    checked = envoy_validate(config)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_tcp_admin_stays_a_socket_address() -> None:
    address = bootstrap_with_admin("127.0.0.1:9901").admin.address
    assert address.WhichOneof("address") == "socket_address"
    assert (address.socket_address.address, address.socket_address.port_value) == (
        "127.0.0.1",
        9901,
    )


def test_a_relative_socket_path_is_refused() -> None:
    with pytest.raises(ValueError, match="unix:/absolute/path"):
        bootstrap_with_admin("unix:admin.sock")


async def test_the_launcher_serves_and_reads_the_admin_over_a_unix_socket(
    tmp_path: Path,
) -> None:
    socket_path = tmp_path / "admin.sock"
    envoy = EnvoyProcess(bootstrap_with_admin(f"unix:{socket_path}"), concurrency=1)
    await envoy.start(timeout=30)
    try:
        assert envoy.admin_url == f"unix:{socket_path}"
        assert stat.S_IMODE(socket_path.stat().st_mode) == 0o600
        assert stat.S_ISSOCK(socket_path.stat().st_mode)
        assert envoy.server_info()["state"] == "LIVE"
        assert "server.state" in envoy.stats()
        assert "configs" in envoy.config_dump()
        assert admin_get(envoy.admin_url, "/no-such-page")[0] == 404
        # Envoy's log is owner-only too: at debug level it prints keys.
        assert stat.S_IMODE(envoy.log_path.stat().st_mode) == 0o600
    finally:
        assert await envoy.stop() == 0


def _listening_tcp_ports(pid: int) -> set[int]:
    """TCP ports process `pid` listens on: its socket inodes found in /proc/net/tcp{,6}."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


@pytest.mark.e2e
def test_up_with_a_unix_socket_admin_serves_and_opens_no_tcp_admin(tmp_path: Path) -> None:
    doc = quickstart_on_free_ports(tmp_path)
    tcp_admin_port = int(doc["sluicegate"]["envoy_admin"].rsplit(":", 1)[1])
    # A directory `up` has to make (Envoy does not), under a short path (sun_path).
    socket_path = tmp_path / "run" / "admin.sock"
    doc["sluicegate"]["envoy_admin"] = f"unix:{socket_path}"
    with running_stack(tmp_path, doc) as stack:
        sdk = OpenAI(base_url=stack.gateway + "/v1", api_key="sk-sluicegate-demo", max_retries=0)
        answer = sdk.chat.completions.create(
            model="qwen-plus",
            messages=[{"role": "user", "content": "hello"}],
        )
        assert answer.choices[0].message.content

        assert stat.S_ISSOCK(socket_path.stat().st_mode)
        assert stat.S_IMODE(socket_path.stat().st_mode) == 0o600
        base = f"unix:{socket_path}"
        assert admin_json(base, "/server_info")["state"] == "LIVE"
        dump = admin_json(base, "/config_dump?resource=dynamic_listeners")
        assert dump["configs"], dump  # the pushed listener is there: ADS works
        stats = flatten_stats(admin_json(base, "/stats?format=json"))
        assert any(k.startswith("http.") and k.endswith("downstream_rq_2xx") and v
                   for k, v in stats.items())  # fmt: skip

        envoys = [pid for pid in children_of(stack.process.pid)
                  if "envoy" in Path(f"/proc/{pid}/comm").read_text()]  # fmt: skip
        assert len(envoys) == 1, envoys
        listening = _listening_tcp_ports(envoys[0])
        # Envoy listens on the gateway's listener only: no admin port, old or new.
        assert listening == {listener["port"] for listener in doc["listeners"]}
        assert tcp_admin_port not in listening

        processes = stack.status()["processes"]
        envoy_status = next(p for p in processes if p["kind"] == "envoy")
        assert (envoy_status["state"], envoy_status["address"]) == ("up", base)
