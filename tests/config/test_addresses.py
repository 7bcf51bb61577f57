"""host:port parsing and socket collisions."""

from __future__ import annotations

import pytest

from sluicegate.config import split_host_port
from sluicegate.config.addresses import collide


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("127.0.0.1:18000", ("127.0.0.1", 18000)),
        ("[::1]:9901", ("::1", 9901)),
        ("xds.prod.svc:1", ("xds.prod.svc", 1)),
        ("0.0.0.0:65535", ("0.0.0.0", 65535)),
    ],
)
def test_split_host_port(value: str, expected: tuple[str, int]) -> None:
    assert split_host_port(value) == expected


@pytest.mark.parametrize(
    "value", ["", "host", "host:", ":1", "h:65536", "h:0", "h:-1", "::1:80", "[::1]80", "h:١٢"]
)
def test_split_host_port_rejects(value: str) -> None:
    with pytest.raises(ValueError):
        split_host_port(value)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (("127.0.0.1", 80), ("127.0.0.1", 80), True),
        (("127.0.0.1", 80), ("127.0.0.1", 81), False),
        (("127.0.0.1", 80), ("localhost", 80), True),
        (("0.0.0.0", 80), ("127.0.0.2", 80), True),
        (("::", 80), ("localhost", 80), True),
        (("127.0.0.1", 80), ("127.0.0.2", 80), False),
        (("0.0.0.0", 80), ("xds.prod.svc", 80), False),
        (("xds.prod.svc", 80), ("XDS.prod.svc", 80), True),
    ],
)
def test_collide(a: tuple[str, int], b: tuple[str, int], expected: bool) -> None:
    assert collide(a, b) is expected
    assert collide(b, a) is expected
