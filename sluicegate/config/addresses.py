"""`host:port` strings and which of them would collide on one machine."""

from __future__ import annotations

import ipaddress

WILDCARD_HOSTS = frozenset({"0.0.0.0", "::"})
_LOOPBACK_NAMES = {"localhost": "127.0.0.1"}


def reachable(address: str) -> str:
    """The `host:port` a client on this machine dials to reach a server listening on
    `address`: a wildcard host (0.0.0.0, ::) is the loopback's."""
    host, sep, port = address.rpartition(":")
    if host.strip("[]") in WILDCARD_HOSTS:
        host = "[::1]" if ":" in host else "127.0.0.1"
    return f"{host}{sep}{port}"


def split_host_port(value: str, *, allow_port_zero: bool = False) -> tuple[str, int]:
    """Split `host:port` or `[v6]:port` into (host, port); raise ValueError when malformed.

    Port 0 ("pick a free one") is only for servers that report the port they got.

    >>> split_host_port("127.0.0.1:18000")
    ('127.0.0.1', 18000)
    >>> split_host_port("[::1]:9901")
    ('::1', 9901)
    """
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
        raise ValueError(f"port must be between 1 and 65535, got {port}")
    return host, port


def is_ip_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _normalise(host: str) -> str:
    return _LOOPBACK_NAMES.get(host.lower(), host.lower())


def _is_local(host: str) -> bool:
    return is_ip_address(host) or host in _LOOPBACK_NAMES


def collide(a: tuple[str, int], b: tuple[str, int]) -> bool:
    """Whether two listening sockets on one machine would fight over the same port.

    A wildcard host (0.0.0.0, ::) collides with every local host on the same port;
    hostnames that are not local (e.g. a Kubernetes service) only collide when equal.
    """
    (host_a, port_a), (host_b, port_b) = a, b
    if port_a != port_b:
        return False
    host_a, host_b = _normalise(host_a), _normalise(host_b)
    if host_a == host_b:
        return True
    wild_a, wild_b = host_a in WILDCARD_HOSTS, host_b in WILDCARD_HOSTS
    return (wild_a and _is_local(host_b)) or (wild_b and _is_local(host_a))
