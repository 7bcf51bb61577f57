"""Where Envoy serves its admin API: a TCP `host:port` or a Unix socket `unix:/path`.

Envoy's admin has no authentication: whoever can connect can set the log level to
debug (after which Envoy logs client keys), dump the config or stop Envoy. A Unix
socket that only Envoy's user may open (mode 0600) is the safe form; TCP is for the
quickstart and deliberate choices, which `validate` warns about (`check_envoy_admin`).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Final

from .addresses import split_host_port

UNIX_PREFIX: Final = "unix:"
# The socket file's mode: read and write for Envoy's user only.
ADMIN_SOCKET_MODE: Final = 0o600
# sockaddr_un.sun_path is 108 bytes on Linux, the last one for the NUL.
_MAX_SOCKET_PATH_BYTES: Final = 107


@dataclass(frozen=True)
class AdminAddress:
    """A parsed admin address: `path` for a Unix socket, else `host` and `port`."""

    path: str | None = None
    host: str = ""
    port: int = 0

    @property
    def is_unix(self) -> bool:
        return self.path is not None

    @property
    def is_loopback(self) -> bool:
        """Only this machine can connect (a Unix socket, or TCP on a loopback address)."""
        if self.path is not None:
            return True
        if self.host.lower() == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False  # a hostname: it may resolve to any interface


def parse_admin_address(value: str, *, allow_port_zero: bool = False) -> AdminAddress:
    """`unix:/abs/path` or `host:port`; raise ValueError with the reason when malformed.

    >>> parse_admin_address("unix:/run/sluicegate/admin.sock").path
    '/run/sluicegate/admin.sock'
    >>> parse_admin_address("127.0.0.1:9901").port
    9901
    """
    if not value.startswith(UNIX_PREFIX):
        host, port = split_host_port(value, allow_port_zero=allow_port_zero)
        return AdminAddress(host=host, port=port)
    path = value[len(UNIX_PREFIX) :]
    if not path.startswith("/"):
        # Envoy resolves a relative path against its own working directory, which is
        # not the config file's: an absolute path says where the socket really is.
        raise ValueError(f"expected unix:/absolute/path, got {value!r}")
    if len(path.encode()) > _MAX_SOCKET_PATH_BYTES:
        raise ValueError(
            f"a Unix socket path is at most {_MAX_SOCKET_PATH_BYTES} bytes, "
            f"got {len(path.encode())}"
        )
    if path.endswith("/") or "\0" in path:
        raise ValueError(f"expected unix:/absolute/path to a file, got {value!r}")
    return AdminAddress(path=path)
