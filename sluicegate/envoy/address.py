"""Envoy Address messages for the host:port strings a bootstrap points at."""

from __future__ import annotations

from envoy.config.core.v3 import address_pb2


def socket_address(host: str, port: int) -> address_pb2.Address:
    return address_pb2.Address(
        socket_address=address_pb2.SocketAddress(address=host, port_value=port)
    )
