"""Command-line wiring: `sluicegate mock-provider ...` and `python -m sluicegate.provider`."""

from __future__ import annotations

import argparse
import logging
import os
import textwrap
from collections.abc import Sequence

from sluicegate.provider.app import PROVIDER_HEADER
from sluicegate.provider.faults import (
    HEADER_END_PAUSE_MS,
    HEADER_FAULT,
    HEADER_FAULT_PROVIDER,
    HEADER_ITL_MS,
    HEADER_OUTPUT_TOKENS,
    HEADER_RETRY_AFTER,
    HEADER_TTFT_MS,
    Fault,
)
from sluicegate.provider.server import run_mock_provider
from sluicegate.provider.settings import MockProviderSettings, parse_models

_DEFAULTS = MockProviderSettings()


def request_headers_help() -> str:
    """The per-request x-mock-* headers, named by the constants the mock reads them with."""
    rows = [
        (HEADER_FAULT, f"force this request's fault: {'|'.join(f.value for f in Fault)}"),
        (
            HEADER_FAULT_PROVIDER,
            f"comma-separated --name values that {HEADER_FAULT} and {HEADER_RETRY_AFTER} "
            "apply to (default: every provider)",
        ),
        (HEADER_RETRY_AFTER, "seconds of Retry-After with a 429 (overrides --retry-after-s)"),
        (HEADER_TTFT_MS, "time to first token in ms (overrides --ttft-ms)"),
        (HEADER_ITL_MS, "inter-token latency in ms (overrides --itl-ms)"),
        (HEADER_OUTPUT_TOKENS, "tokens in the answer (overrides --output-tokens)"),
        (HEADER_END_PAUSE_MS, "a stream's pause in ms after its last token, before its end"),
    ]
    width = max(len(name) for name, _ in rows)
    indent = " " * (width + 4)
    lines = [
        textwrap.fill(
            f"  {name:<{width}}  {text}", 79, subsequent_indent=indent, break_on_hyphens=False
        )
        for name, text in rows
    ]
    return (
        "request headers (per request, on top of the flags):\n"
        + "\n".join(lines)
        + f"\n\nEvery answer carries {PROVIDER_HEADER}: <--name>."
    )


def add_mock_provider_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the mock provider's flags to `parser` (a sub-command's parser, typically), and
    list its x-mock-* request headers after them in --help."""
    parser.epilog = request_headers_help()
    # Keeps the epilog's table as written (argparse would rewrap it into one paragraph).
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    d = _DEFAULTS
    parser.add_argument("--name", default=d.name, help="provider name, sent as x-mock-provider")
    parser.add_argument("--host", default=d.host, help="address to bind (default %(default)s)")
    parser.add_argument("--port", type=int, default=d.port, help="port, 0 = any free port")
    key = parser.add_mutually_exclusive_group()
    key.add_argument("--api-key", help="require 'Authorization: Bearer KEY'")
    key.add_argument(
        "--api-key-env", metavar="VAR", help="like --api-key, read from env VAR (keeps it off ps)"
    )
    parser.add_argument(
        "--models", default="", help="comma-separated model ids to accept (default: any)"
    )
    parser.add_argument("--ttft-ms", type=float, default=d.ttft_ms, help="time to first token")
    parser.add_argument("--itl-ms", type=float, default=d.itl_ms, help="inter-token latency")
    parser.add_argument(
        "--jitter-ms", type=float, default=d.jitter_ms, help="uniform +/- jitter on each delay"
    )
    parser.add_argument(
        "--output-tokens", type=int, default=d.output_tokens, help="tokens per answer"
    )
    for kind in ("429", "500", "503", "reset", "cut", "hang"):
        parser.add_argument(
            f"--rate-{kind}",
            type=float,
            default=0.0,
            metavar="P",
            help=f"probability 0..1 of a '{kind}' fault per request",
        )
    parser.add_argument(
        "--retry-after-s", type=int, default=d.retry_after_s, help="Retry-After sent with 429"
    )
    parser.add_argument("--seed", type=int, default=None, help="seed for faults and jitter")
    parser.add_argument("--tls-cert", help="serve HTTPS with this PEM certificate (with --tls-key)")
    parser.add_argument("--tls-key", help="PEM private key for --tls-cert")
    parser.add_argument(
        "--early-headers",
        action="store_true",
        help="send response headers before the first token (default: with it, like OpenAI)",
    )
    parser.add_argument(
        "--keepalive-timeout-s",
        type=float,
        default=d.keepalive_timeout_s,
        help="close idle keep-alive connections after this long",
    )


def settings_from_args(ns: argparse.Namespace) -> MockProviderSettings:
    """Build settings from parsed flags; ValueError on inconsistent values."""
    api_key: str | None = ns.api_key
    if ns.api_key_env:
        api_key = os.environ.get(ns.api_key_env)
        if not api_key:
            raise ValueError(f"environment variable {ns.api_key_env} is not set")
    return MockProviderSettings(
        name=ns.name,
        host=ns.host,
        port=ns.port,
        api_key=api_key,
        models=parse_models(ns.models),
        ttft_ms=ns.ttft_ms,
        itl_ms=ns.itl_ms,
        jitter_ms=ns.jitter_ms,
        output_tokens=ns.output_tokens,
        rate_429=ns.rate_429,
        rate_500=ns.rate_500,
        rate_503=ns.rate_503,
        rate_reset=ns.rate_reset,
        rate_cut=ns.rate_cut,
        rate_hang=ns.rate_hang,
        retry_after_s=ns.retry_after_s,
        seed=ns.seed,
        tls_cert=ns.tls_cert,
        tls_key=ns.tls_key,
        early_headers=ns.early_headers,
        keepalive_timeout_s=ns.keepalive_timeout_s,
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m sluicegate.provider",
        description="Mock OpenAI-compatible LLM provider with fault injection.",
    )
    add_mock_provider_arguments(parser)
    # Only here: a host CLI that embeds the flags above configures logging itself.
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    ns = parser.parse_args(argv)
    logging.basicConfig(level=ns.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        settings = settings_from_args(ns)
    except ValueError as exc:
        parser.error(str(exc))
    run_mock_provider(settings)
