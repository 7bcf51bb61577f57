"""Which fault a request gets (per-request headers first, then the configured rates),
and how to drop a connection the way a crashing upstream does."""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import socket
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from sluicegate.provider.settings import MockProviderSettings

HEADER_FAULT = "x-mock-fault"
HEADER_FAULT_PROVIDER = "x-mock-fault-provider"
HEADER_RETRY_AFTER = "x-mock-retry-after"
HEADER_TTFT_MS = "x-mock-ttft-ms"
HEADER_ITL_MS = "x-mock-itl-ms"
HEADER_OUTPUT_TOKENS = "x-mock-output-tokens"
HEADER_END_PAUSE_MS = "x-mock-end-pause-ms"


class Fault(StrEnum):
    NONE = "none"
    RATE_LIMIT = "429"
    SERVER_ERROR = "500"
    UNAVAILABLE = "503"
    RESET = "reset"
    CUT = "cut"
    HANG = "hang"
    # A provider that misbehaves on the wire but answers 200: malformed SSE events mid-stream
    # and no usage (even when asked), or a JSON body that does not parse. Header only.
    GARBAGE = "garbage"


# Order of the cumulative draw over the settings' rate_* fields.
_RATED: tuple[tuple[str, Fault], ...] = (
    ("rate_429", Fault.RATE_LIMIT),
    ("rate_500", Fault.SERVER_ERROR),
    ("rate_503", Fault.UNAVAILABLE),
    ("rate_reset", Fault.RESET),
    ("rate_cut", Fault.CUT),
    ("rate_hang", Fault.HANG),
)


@dataclass(frozen=True)
class Overrides:
    """Per-request test knobs read from x-mock-* headers; None means 'use the settings'."""

    fault: Fault | None = None
    retry_after_s: int | None = None
    ttft_ms: float | None = None
    itl_ms: float | None = None
    output_tokens: int | None = None
    # A stream's pause after its last token, before its final chunk, usage and [DONE].
    end_pause_ms: float | None = None


def parse_overrides(headers: Mapping[str, str], provider_name: str) -> Overrides:
    """Read the x-mock-* headers; ValueError names the offending header."""
    fault: Fault | None = None
    retry_after: int | None = None
    if _targets_this_provider(headers.get(HEADER_FAULT_PROVIDER), provider_name):
        raw_fault = headers.get(HEADER_FAULT)
        if raw_fault is not None:
            try:
                fault = Fault(raw_fault.strip().lower())
            except ValueError:
                allowed = "|".join(f.value for f in Fault)
                raise ValueError(f"{HEADER_FAULT} must be one of {allowed}") from None
        retry_after = _header_number(headers, HEADER_RETRY_AFTER, int, minimum=0)
    return Overrides(
        fault=fault,
        retry_after_s=retry_after,
        ttft_ms=_header_number(headers, HEADER_TTFT_MS, float, minimum=0),
        itl_ms=_header_number(headers, HEADER_ITL_MS, float, minimum=0),
        output_tokens=_header_number(headers, HEADER_OUTPUT_TOKENS, int, minimum=1),
        end_pause_ms=_header_number(headers, HEADER_END_PAUSE_MS, float, minimum=0),
    )


def _targets_this_provider(target: str | None, provider_name: str) -> bool:
    # Absent header: faults apply to every provider. Otherwise a comma-separated list.
    if target is None:
        return True
    return provider_name in {name.strip() for name in target.split(",")}


_N = TypeVar("_N", int, float)


def _header_number(
    headers: Mapping[str, str], name: str, kind: type[_N], *, minimum: _N
) -> _N | None:
    raw = headers.get(name)
    if raw is None:
        return None
    try:
        value = kind(raw.strip())
    except ValueError:
        raise ValueError(f"{name} must be a{'n integer' if kind is int else ' number'}") from None
    if not math.isfinite(value) or value < minimum:
        raise ValueError(f"{name} must be >= {minimum}")
    return value


def choose_fault(settings: MockProviderSettings, forced: Fault | None, rng: random.Random) -> Fault:
    """The header wins (including 'none'); otherwise one uniform draw over the rates."""
    if forced is not None:
        return forced
    if not any(getattr(settings, name) for name, _ in _RATED):
        return Fault.NONE  # skip the draw so seeded runs stay comparable
    draw = rng.random()
    cumulative = 0.0
    for name, fault in _RATED:
        cumulative += getattr(settings, name)
        if draw < cumulative:
            return fault
    return Fault.NONE


def abort_connection(transport: asyncio.BaseTransport | None) -> None:
    """Drop the TCP connection with an RST (SO_LINGER 0), not an orderly FIN.

    A crashed or overloaded upstream looks like this to Envoy ('upstream reset'), which is
    what its `reset` / `connect-failure` retry conditions are about.
    """
    if transport is None or transport.is_closing():
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        # Some transports (TLS, uvloop) hand out a socket-like wrapper; RST is best effort.
        with contextlib.suppress(OSError, AttributeError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    if isinstance(transport, asyncio.Transport | asyncio.WriteTransport):
        transport.abort()
    else:  # pragma: no cover - aiohttp always hands us a Transport
        transport.close()
