"""free_ports: two pytest-xdist workers never pick the same port, and no connection takes
one before its test binds it."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluicegate.testing import free_ports


@pytest.mark.parametrize("worker", [0, 1])
def test_each_worker_takes_only_its_share_of_the_ports(
    monkeypatch: pytest.MonkeyPatch, worker: int
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    ports = free_ports(40)
    assert len(set(ports)) == 40
    assert all(port % 2 == worker for port in ports)


def test_ports_are_below_the_kernels_ephemeral_range() -> None:
    """No outgoing connection (nor a bind to port 0) can take a port picked there before
    the test binds it."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert all(1024 <= port < low for port in free_ports(40))


@pytest.mark.parametrize("worker", [0, 1])
def test_a_host_whose_ephemeral_range_leaves_too_few_ports_below_uses_that_range(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, worker: int
) -> None:
    """`1024 65535`, as load-testing hosts often set it: nothing is below, so the ports
    come from the ephemeral range, each worker's share still (a kernel's pick, a bind to
    port 0, would give only odd ones: worker 0 would wait forever)."""
    import sluicegate.testing.ports as ports_module

    wide = tmp_path / "ip_local_port_range"
    wide.write_text("1024\t65535\n")
    monkeypatch.setattr(ports_module, "_PORT_RANGE_FILE", wide)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    ports = free_ports(10)
    assert len(set(ports)) == 10
    assert all(port % 2 == worker and port >= 1024 for port in ports)
