"""Steady load through a gateway while something is killed, and every request's outcome.

Shared by tests/e2e/test_faults.py and benchmarks/faults.py. Each client thread sends one
chat completion after another on its own keep-alive connection and records when it
started, when it ended and what came back; `judge` sorts the failures by where they
started relative to a kill.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

# The aim: a request that starts this long after a kill must not fail.
SETTLED_S = 2.0


@dataclass(frozen=True, slots=True)
class Outcome:
    start: float  # time.monotonic()
    end: float
    status: int  # 0: no HTTP answer (connection refused or reset)
    code: str | None = None  # the OpenAI error's `code`, or the exception's name

    @property
    def ok(self) -> bool:
        return self.status == 200


@dataclass
class Load:
    """What the client threads recorded so far (append-only; read it after `stop`)."""

    outcomes: list[Outcome] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, outcome: Outcome) -> None:
        with self.lock:
            self.outcomes.append(outcome)

    def since(self, moment: float) -> list[Outcome]:
        with self.lock:
            return [o for o in self.outcomes if o.start >= moment]


def _error_code(body: bytes) -> str | None:
    try:
        error = json.loads(body)["error"]
        return str(error.get("code"))
    except (ValueError, KeyError, TypeError, AttributeError):
        return "not_openai_json"


def _client(
    host: str, port: int, body: bytes, headers: Mapping[str, str], load: Load, stop: threading.Event
) -> None:
    connection: http.client.HTTPConnection | None = None
    while not stop.is_set():
        start = time.monotonic()
        try:
            if connection is None:
                connection = http.client.HTTPConnection(host, port, timeout=30)
            connection.request("POST", "/v1/chat/completions", body, dict(headers))
            response = connection.getresponse()
            answer = response.read()
            status = response.status
            code = None if status == 200 else _error_code(answer)
            if response.will_close:
                connection.close()
                connection = None
        except (OSError, http.client.HTTPException) as err:
            status, code = 0, type(err).__name__
            if connection is not None:
                connection.close()
            connection = None
            time.sleep(0.01)  # a refused connection fails at once: do not spin
        load.add(Outcome(start, time.monotonic(), status, code))
    if connection is not None:
        connection.close()


@contextmanager
def steady_load(
    url: str, model: str, headers: Mapping[str, str], clients: int = 8
) -> Iterator[Load]:
    """`clients` threads sending chat completions to `url` (http://host:port) until the
    block ends."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    ).encode()
    sent = {"content-type": "application/json", **headers}
    load = Load()
    stop = threading.Event()
    threads = [
        threading.Thread(target=_client, args=(host, int(port), body, sent, load, stop))
        for _ in range(clients)
    ]
    for thread in threads:
        thread.start()
    try:
        yield load
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)


@dataclass(frozen=True)
class Verdict:
    """The outcomes of requests around one kill at `kill` (monotonic), up to `until`."""

    what: str
    total: int
    failed_in_flight: int  # started before the kill, ended after it
    failed_soon_after: int  # started within SETTLED_S after the kill
    failed_settled: int  # started SETTLED_S or more after the kill: must be 0
    back_after_s: float | None  # the killed process serving again, seconds after the kill
    codes: dict[str, int]  # every failure by status and code

    def row(self) -> list[Any]:
        back = "never" if self.back_after_s is None else f"{self.back_after_s:.2f} s"
        codes = ", ".join(f"{k} x{v}" for k, v in sorted(self.codes.items())) or "-"
        return [
            self.what,
            self.total,
            self.failed_in_flight,
            self.failed_soon_after,
            self.failed_settled,
            back,
            codes,
        ]


def judge(
    what: str, outcomes: Sequence[Outcome], kill: float, back_after_s: float | None
) -> Verdict:
    failed = [o for o in outcomes if not o.ok]
    codes: dict[str, int] = {}
    for outcome in failed:
        key = f"{outcome.status} {outcome.code}"
        codes[key] = codes.get(key, 0) + 1
    return Verdict(
        what=what,
        total=len(outcomes),
        failed_in_flight=sum(1 for o in failed if o.start < kill),
        failed_soon_after=sum(1 for o in failed if kill <= o.start < kill + SETTLED_S),
        failed_settled=sum(1 for o in failed if o.start >= kill + SETTLED_S),
        back_after_s=back_after_s,
        codes=codes,
    )


def wait_until(check: Callable[[], bool], timeout_s: float, poll_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(poll_s)
    return check()
