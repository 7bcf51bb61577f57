"""`sluicegate-routing`, `-fast-routing`, `-admission`, `-fast-admission` and
`-auto-admission`: the real
stack (`sluicegate up`: control plane, one ext_proc server, Envoy with one worker unless
told) serving the documents of `documents.py`. What each does per request: ROUTING,
FAST_ROUTING, ADMISSION and FAST_ADMISSION."""

from __future__ import annotations

import importlib.metadata
import itertools
import secrets
from pathlib import Path
from typing import Final, Literal

from benchmarks.harness.stack import UpStack
from sluicegate.testing import free_ports

from .documents import (
    admission_doc,
    auto_admission_doc,
    fast_admission_doc,
    fast_routing_doc,
    routing_doc,
)
from .peer import RunningPeer, Upstream
from .plain_envoy import envoy_version
from .processes import tree, wait_idle

ROUTING: Final = (
    "Envoy buffers the body and sends it to the ext_proc routing stage (one gRPC stream "
    "per request), which routes the model and says who reads the usage; no key is checked, "
    "nothing is reserved or charged; Envoy sends each request's record (an access log "
    "batched every 100 ms) to the ext_proc server"
)
FAST_ROUTING: Final = (
    "Envoy buffers the body and its model reader (a Lua filter walking the body's top "
    "level) reads `model` and `stream` and names the usage reader; Envoy matches the "
    "model's route on them: no ext_proc stream, no Python on the request path; Envoy "
    "sends each request's record (an access log batched every 100 ms) to the ext_proc server"
)
ADMISSION: Final = (
    "as routing, plus: the client key (random per run, `Authorization: Bearer`) is checked "
    "against the one tenant's key hash and removed; the estimate (prompt estimate + "
    "max_tokens, else 1,024) is reserved on the tenant's requests and tokens limits "
    "(10^9 requests and 10^12 tokens a minute: never refusing) in the memory store; the "
    "route's priority gate (100,000 requests and 10^10 tokens in flight; the tenant's "
    "class `standard` may use 75 %) holds a slot until the response ends; Envoy reads "
    "the usage (a JSON answer's `usage`; a stream's usage event, asked for in the body "
    "when the client did not, and cut out again), and the record charges it in place of "
    "the reservation"
)


FAST_ADMISSION: Final = (
    "as fast-routing, plus: Envoy checks the client key (random per run, `Authorization: "
    "Bearer`; its api_key_auth filter, the key from a secret file) and removes it; the "
    "model reader names the tenant and estimates the request's tokens (prompt estimate + "
    "max_tokens, else 1,024), charged to the tenant's token buckets for requests and "
    "tokens (10^9 requests and 4x10^9 tokens a minute: never refusing) in Envoy's "
    "local_ratelimit; the route's priority gate in Envoy (100,000 requests in flight, "
    "two partitions of the route cluster's circuit breakers: a second tenant `vip`, never "
    "calling, of the top class `interactive` holds 25 %, the tenant's class `standard` 75 "
    "%, of the pool's 4,096 connections: DEFAULT 3,072 in flight and 768 pending, HIGH "
    "1,024 and 256); nothing reconciled"
)
AUTO_ADMISSION: Final = (
    "as fast-admission without the gate and `vip` (an `auto` tenant's requests for a gated "
    "model take the exact lane), with the tenant `lane: auto`: far from its limits, so it stays in "
    "the fast lane; the ext_proc server charges each of its requests' records into the "
    "tenant's exact-lane windows and sends the control plane a usage note of each (batched "
    "every 100 ms), which it counts against the tenant's limits; Envoy also records each "
    "request while it runs (every 500 ms) and sends those records to the ext_proc server"
)


Kind = Literal["routing", "fast-routing", "admission", "fast-admission", "auto-admission"]
DOES: Final = {
    "routing": ROUTING,
    "fast-routing": FAST_ROUTING,
    "admission": ADMISSION,
    "fast-admission": FAST_ADMISSION,
    "auto-admission": AUTO_ADMISSION,
}


class SluicegateStack:
    def __init__(self, work: Path, *, kind: Kind, envoy_concurrency: int = 1) -> None:
        self.name = f"sluicegate-{kind}"
        self.does = DOES[kind]
        self.kind = kind
        self.work = work
        self.envoy_concurrency = envoy_concurrency
        self._runs = itertools.count(1)

    def install(self) -> None:
        pass  # the project's own venv

    def version(self) -> str:
        return (
            f"sluicegate {importlib.metadata.version('sluicegate')}, {envoy_version()} "
            f"--concurrency {self.envoy_concurrency}, 1 ext_proc process"
        )

    def start(self, upstream: Upstream) -> RunningPeer:
        (port,) = free_ports(1)
        headers: dict[str, str] = {}
        if self.kind == "admission":
            key = "sk-bench-" + secrets.token_hex(24)  # only its hash is written down
            doc = admission_doc(upstream, port, key)
            headers["authorization"] = f"Bearer {key}"
        elif self.kind in ("fast-admission", "auto-admission"):
            key = "sk-bench-" + secrets.token_hex(24)
            key_file = self.work / f"{self.name}-{port}.key"
            key_file.parent.mkdir(parents=True, exist_ok=True)
            key_file.write_text(key)
            if self.kind == "fast-admission":
                vip_file = self.work / f"{self.name}-{port}-vip.key"
                vip_file.write_text("sk-bench-" + secrets.token_hex(24))
                doc = fast_admission_doc(
                    upstream, port, key, str(key_file.resolve()), str(vip_file.resolve())
                )
            else:
                doc = auto_admission_doc(upstream, port, key, str(key_file.resolve()))
            headers["authorization"] = f"Bearer {key}"
        elif self.kind == "fast-routing":
            doc = fast_routing_doc(upstream, port)
        else:
            doc = routing_doc(upstream, port)
        # `UpStack` passes --envoy-concurrency 1 first; a later one wins.
        extra = ["--envoy-concurrency", str(self.envoy_concurrency)]
        stack = UpStack(self.work / f"{self.name}-{next(self._runs)}", doc, extra=extra)
        try:
            stack.wait_serving(upstream.model, headers)
            wait_idle(lambda: tree(stack.process.pid))
        except BaseException:
            stack.stop()
            raise

        def stop() -> None:
            stack.stop()

        return RunningPeer(
            self.name, stack.url, upstream.model, lambda: tree(stack.process.pid), stop, headers
        )
