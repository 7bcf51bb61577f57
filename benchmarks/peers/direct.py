"""`direct`: the upstream itself, no gateway: the limit every gateway is measured against."""

from __future__ import annotations

from .peer import RunningPeer, Upstream


class Direct:
    name = "direct"
    does = "nothing: the client talks to the upstream itself (no process of its own)"

    def install(self) -> None:
        pass

    def version(self) -> str:
        return "the upstream itself"

    def start(self, upstream: Upstream) -> RunningPeer:
        return RunningPeer(self.name, upstream.url, upstream.model, lambda: [], lambda: None)
