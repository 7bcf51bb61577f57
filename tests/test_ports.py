"""free_ports: two pytest-xdist workers never pick the same port."""

from __future__ import annotations

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
