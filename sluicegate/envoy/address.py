"""`host:port` parsing for the addresses a bootstrap points at."""

from __future__ import annotations

import ipaddress

from envoy.config.core.v3 import address_pb2


def parse_address(value: str, *, allow_port_zero: bool = False) -> tuple[str, int]:
    """Split `host:port` or `[v6]:port`; raise ValueError when malformed."""
    if value.startswith("["):
        host, bracket, rest = value[1:].partition("]")
        if not bracket or not rest.startswith(":"):
            raise ValueError(f"expected [ipv6]:port, got {value!r}")
        port_text = rest[1:]
    else:
        host, colon, port_text = value.rpartition(":")
        if not colon:
            raise ValueError(f"expected host:port, got {value!r}")
        if ":" in host:
            raise ValueError(f"put an IPv6 address in brackets, like [::1]:18000; got {value!r}")
    if not host:
        raise ValueError(f"expected host:port with a host, got {value!r}")
    if not port_text.isascii() or not port_text.isdigit():
        raise ValueError(f"expected a numeric port after ':', got {value!r}")
    port = int(port_text)
    if not (0 if allow_port_zero else 1) <= port <= 65535:
        raise ValueError(f"port out of range in {value!r}")
    return host, port


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def socket_address(host: str, port: int) -> address_pb2.Address:
    return address_pb2.Address(
        socket_address=address_pb2.SocketAddress(address=host, port_value=port)
    )
