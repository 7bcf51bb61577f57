"""What every peer of the comparison is: an upstream to route to, a peer that installs
itself and starts against it, and the running peer a load generator drives."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent.parent
# Installs of the peers that are not in the project's venv (gitignored, kept between runs).
CACHE = ROOT / ".bench-peers"
# The provider key the peers that forward one send upstream (LiteLLM's OpenAI client
# insists on one; Portkey forwards the client's). Not a secret: the upstream checks none.
UPSTREAM_KEY = "sk-upstream-unchecked"


@dataclass(frozen=True)
class Upstream:
    """The OpenAI-compatible server every peer routes to: its base URL without `/v1`
    (`http://127.0.0.1:PORT`) and the model to ask it for. The mock provider now, the
    fixed-answer upstream of `sluicegate.bench` later: nothing else is assumed of it."""

    url: str
    model: str

    @property
    def api_base(self) -> str:
        """The base an OpenAI client is given: the URL with `/v1`."""
        return self.url.rstrip("/") + "/v1"

    @property
    def host_port(self) -> tuple[str, int]:
        parts = urlsplit(self.url)
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"upstream URL without host and port: {self.url}")
        return parts.hostname, parts.port


@dataclass
class RunningPeer:
    """A started peer. `url` is the base a client adds `/v1/chat/completions` to;
    `model` and `headers` go on every request (`headers` may hold a per-run secret:
    never print them). `pids()` lists the whole process tree now (none for `direct`),
    for CPU and RSS; `stop()` ends all of it."""

    name: str
    url: str
    model: str
    pids: Callable[[], list[int]]
    stop: Callable[[], None]
    headers: Mapping[str, str] = field(default_factory=dict)


class Peer(Protocol):
    """One gateway of the comparison. `does` says what it does per request (auth,
    limits, logging), for the results, so nobody mistakes what was compared."""

    name: str
    does: str

    def install(self) -> None:
        """Install what is missing (idempotent; cached under CACHE), saying what it
        installs."""

    def version(self) -> str:
        """What runs, with versions (after install)."""

    def start(self, upstream: Upstream) -> RunningPeer:
        """Start it routing to `upstream`; return once it serves."""
