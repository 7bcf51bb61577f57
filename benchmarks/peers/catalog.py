"""Every peer of the comparison, by name, in the order the suite runs them."""

from __future__ import annotations

import os
from pathlib import Path

from .direct import Direct
from .litellm_proxy import LitellmProxy
from .peer import Peer
from .plain_envoy import PlainEnvoy
from .portkey_gateway import PortkeyGateway
from .sluicegate_stack import SluicegateStack


def cores() -> int:
    """The cores this process may run on: LiteLLM's second peer runs one worker each."""
    return len(os.sched_getaffinity(0))


def peers(work: Path, *, envoy_concurrency: int = 1) -> dict[str, Peer]:
    """direct, envoy, sluicegate-routing, sluicegate-fast-routing, sluicegate-admission,
    sluicegate-fast-admission, sluicegate-auto-admission, litellm-1, litellm-N
    (N = cores), portkey; each keeps its files of a run under `work`."""
    found: list[Peer] = [
        Direct(),
        PlainEnvoy(work, concurrency=envoy_concurrency),
        SluicegateStack(work, kind="routing", envoy_concurrency=envoy_concurrency),
        SluicegateStack(work, kind="fast-routing", envoy_concurrency=envoy_concurrency),
        SluicegateStack(work, kind="admission", envoy_concurrency=envoy_concurrency),
        SluicegateStack(work, kind="fast-admission", envoy_concurrency=envoy_concurrency),
        SluicegateStack(work, kind="auto-admission", envoy_concurrency=envoy_concurrency),
        LitellmProxy(work, workers=1),
        LitellmProxy(work, workers=cores()),
        PortkeyGateway(work),
    ]
    return {peer.name: peer for peer in found}
