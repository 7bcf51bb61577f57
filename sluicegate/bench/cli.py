"""`sluicegate bench ...` and `sluicegate bench compare A.json B.json`: the flags, the
spec they make, and what is printed and written."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Final

from sluicegate.bench.compare import load_run, render_comparison
from sluicegate.bench.keys import Secret, default_key, key_from_env, key_from_file
from sluicegate.bench.plot import INSTALL_HINT, plotting_available, write_plot
from sluicegate.bench.report import render
from sluicegate.bench.runner import run_bench_sync
from sluicegate.bench.scenarios import load_scenarios_file, parse_scenario_flag
from sluicegate.bench.spec import MAX_INFLIGHT, QUEUE_HEADER, REFUSAL_HEADER, BenchSpec, SpecError
from sluicegate.bench.units import parse_fraction, parse_seconds
from sluicegate.bench.workers import BenchError

PROG: Final = "sluicegate bench"
EXIT_SLO_MISSED: Final = 3
_EPILOG: Final = """\
examples:
  sluicegate bench --url http://127.0.0.1:10000 --api-key-env TENANT_KEY \\
      --concurrency 16 --duration 60s --warmup 5s --json run.json
  sluicegate bench --url http://127.0.0.1:10000 --rate 20 --sweep --duration 30s \\
      --slo ttft_p95=2s,tpot_p95=80ms,error_rate=0.1% --plot sweep.png
  sluicegate bench compare before.json after.json

exit status: 0 done; 1 the run could not be made; 2 bad flags; 3 the SLO was missed
(a sweep: even its first step).
"""


def _seconds(text: str) -> float:
    """--duration, --warmup, --timeout: a duration (`30s`, `2m`) or bare seconds."""
    try:
        value = float(text)
    except ValueError:
        try:
            value = parse_seconds(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _processes(text: str) -> int | None:
    return None if text == "auto" else _positive_int(text)


def _ramp(text: str) -> tuple[float | None, float]:
    low, colon, high = text.partition(":")
    try:
        if not colon:
            return None, float(low)
        return (float(low) if low.strip() else None), float(high)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected FROM:TO (or TO), got {text!r}") from None


def _fraction(text: str) -> float:
    try:
        return parse_fraction(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _header(text: str) -> tuple[str, str]:
    name, colon, value = text.partition(":")
    if not colon or not name.strip():
        raise argparse.ArgumentTypeError(f"expected 'Name: value', got {text.split(':')[0]!r}")
    return name.strip(), value.strip()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `sluicegate bench` (and its `compare` sub-command) on `parser`."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = (
        "Load-test an OpenAI-compatible endpoint (the gateway, a provider, another\n"
        "gateway) with chat completions: TTFT, TPOT, ITL and E2E percentiles, goodput,\n"
        "errors and the gateway's refusals, overall, per scenario and per priority.\n"
        "Every run is bounded by --duration or --requests. docs/bench.md."
    )
    parser.epilog = _EPILOG
    sub = parser.add_subparsers(dest="bench_command", metavar="{compare}")
    compare = sub.add_parser("compare", help="print two --json runs side by side, with B/A")
    compare.add_argument("a", metavar="A.json")
    compare.add_argument("b", metavar="B.json")

    target = parser.add_argument_group("endpoint")
    target.add_argument("--url", help="base URL, e.g. http://127.0.0.1:10000 (requests go to "
                        "/v1/chat/completions under it)")  # fmt: skip
    key = target.add_mutually_exclusive_group()
    key.add_argument("--api-key", metavar="KEY", help="the key; visible to every user in `ps` "
                     "and kept in shell history: prefer --api-key-env or --api-key-file")
    key.add_argument("--api-key-env", metavar="VAR", help="read the key from env VAR "
                     "(default: OPENAI_API_KEY when set)")  # fmt: skip
    key.add_argument("--api-key-file", metavar="PATH", help="read the key from a file")
    target.add_argument("--model", help="default: the first id of GET {url}/v1/models")
    target.add_argument("--header", action="append", type=_header, default=[],
                        metavar="'NAME: VALUE'", help="one more request header (repeat)")
    target.add_argument("--no-stream", action="store_true", help="ask for JSON answers")
    target.add_argument("--no-stream-usage", action="store_true",
                        help="do not ask for the usage event (stream_options.include_usage)")
    target.add_argument("--timeout", type=_seconds, default=600.0, metavar="S",
                        help="per request, connecting included (default 600s)")  # fmt: skip

    shape = parser.add_argument_group("load")
    shape.add_argument("--concurrency", type=_positive_int, metavar="N",
                       help="closed loop: N requests in flight, each sent when one ends")
    shape.add_argument("--rate", type=float, metavar="R", help="open loop: Poisson arrivals at "
                       "R requests/s that never wait for answers")  # fmt: skip
    shape.add_argument("--ramp", type=_ramp, metavar="FROM:TO", help="move --rate or "
                       "--concurrency from FROM to TO over --duration (TO alone: from the "
                       "flag's value)")  # fmt: skip
    shape.add_argument("--max-inflight", type=_positive_int, default=MAX_INFLIGHT, metavar="N",
                       help="open loop: arrivals beyond N in flight are dropped and counted "
                       "(default %(default)s)")  # fmt: skip
    shape.add_argument("--duration", type=_seconds, metavar="D",
                       help="measure for D (30s, 2m); one of --duration and --requests")
    shape.add_argument("--requests", type=_positive_int, metavar="N",
                       help="measure N requests")  # fmt: skip
    shape.add_argument("--warmup", type=_seconds, default=0.0, metavar="S",
                       help="run S of load first, left out of every figure")  # fmt: skip
    shape.add_argument("--processes", type=_processes, default=None, metavar="N|auto",
                       help="worker processes (default auto: 1 below 1,000 req/s or "
                       "concurrency 64, else every core)")  # fmt: skip

    mix = parser.add_argument_group("request mix")
    mix.add_argument("--prompts", metavar="FILE.jsonl", help="one request a line: messages or "
                     "prompt, optional max_tokens and scenario")  # fmt: skip
    mix.add_argument("--input-tokens", metavar="DIST", help="prompt length: fixed:N, "
                     "uniform:A-B, lognormal:mean=M,sigma=S (default fixed:256)")  # fmt: skip
    mix.add_argument("--output-tokens", metavar="DIST", help="max_tokens asked, same forms "
                     "(default fixed:128; a prompt line's own max_tokens wins)")  # fmt: skip
    mix.add_argument("--ignore-eos", action="store_true",
                     help="send ignore_eos: true (vLLM: generate all max_tokens)")
    mix.add_argument("--seed", type=int, default=0, help="seed of every random draw")
    mix.add_argument("--scenarios", metavar="FILE.yaml", help="named scenarios (docs/bench.md)")
    mix.add_argument("--scenario", action="append", default=[], metavar="SPEC",
                     help="name=qa,share=3,input=DIST,output=DIST,prompts=FILE,"
                     "key-env=VAR|key-file=PATH,priority=CLASS,model=M (repeat)")  # fmt: skip

    goals = parser.add_argument_group("objectives")
    goals.add_argument("--slo", metavar="SPEC", help="e.g. ttft_p95=2s,tpot_p95=80ms,"
                       "e2e_p99=30s,itl_p99=50ms,error_rate=0.1%% (also goodput's objectives)")
    goals.add_argument("--sweep", action="store_true", help="find the highest --rate or "
                       "--concurrency (the start) still meeting --slo")  # fmt: skip
    goals.add_argument("--sweep-steps", type=_positive_int, default=12, metavar="N",
                       help="at most N steps (default %(default)s)")  # fmt: skip
    goals.add_argument("--sweep-factor", type=float, default=2.0, metavar="F",
                       help="grow the load by F per step (default %(default)s)")  # fmt: skip
    goals.add_argument("--sweep-resolution", type=_fraction, default=0.05, metavar="R",
                       help="bisect until within R, e.g. 5%% (default)")  # fmt: skip
    goals.add_argument("--refusal-header", default=REFUSAL_HEADER, metavar="NAME",
                       help="a 429/503 with it is the gateway's refusal (default %(default)s)")
    goals.add_argument("--queue-header", default=QUEUE_HEADER, metavar="NAME",
                       help="queue time in ms (default %(default)s)")  # fmt: skip

    out = parser.add_argument_group("output")
    out.add_argument("--json", metavar="FILE", help="write every figure as JSON")
    out.add_argument("--plot", metavar="FILE.png",
                     help=f"latency over time (and against load); needs {INSTALL_HINT}")
    out.add_argument("--quiet", action="store_true", help="no progress line on stderr")


def _key(args: argparse.Namespace) -> Secret | None:
    try:
        if args.api_key is not None:
            return Secret(args.api_key.strip())
        if args.api_key_env:
            return key_from_env(args.api_key_env)
        if args.api_key_file:
            return key_from_file(args.api_key_file)
        return default_key()
    except ValueError as err:
        flag = ("--api-key" if args.api_key is not None
                else "--api-key-env" if args.api_key_env else "--api-key-file")  # fmt: skip
        raise SpecError(flag, str(err)) from None


def spec_from_args(args: argparse.Namespace) -> BenchSpec:
    """SpecError naming the flag for anything wrong."""
    if not args.url:
        raise SpecError("--url", "required: the endpoint's base URL, e.g. http://127.0.0.1:10000")
    if args.plot and not plotting_available():
        raise SpecError("--plot", f"needs matplotlib: {INSTALL_HINT}")
    if args.json and not Path(args.json).resolve().parent.is_dir():
        raise SpecError("--json", f"no such directory for {args.json}")
    concurrency, rate, ramp = args.concurrency, args.rate, None
    if args.ramp is not None:
        low, high = args.ramp
        start = concurrency if concurrency is not None else rate
        if low is None:
            if start is None:
                raise SpecError("--ramp", "give --rate or --concurrency (the ramp's start)")
            low = float(start)
        ramp = (low, high)
    scenarios = [parse_scenario_flag(text) for text in args.scenario]
    if args.scenarios:
        if scenarios:
            raise SpecError("--scenarios", "give --scenarios FILE or --scenario, not both")
        scenarios = load_scenarios_file(args.scenarios)
    return BenchSpec(
        url=args.url, api_key=_key(args), model=args.model, stream=not args.no_stream,
        stream_usage=not args.no_stream_usage, concurrency=concurrency, rate=rate, ramp=ramp,
        max_inflight=args.max_inflight, duration_s=args.duration, requests=args.requests,
        warmup_s=args.warmup, input_tokens=args.input_tokens or "fixed:256",
        output_tokens=args.output_tokens, prompts=args.prompts, scenarios=tuple(scenarios),
        ignore_eos=args.ignore_eos, seed=args.seed, timeout_s=args.timeout,
        processes=args.processes, slo=args.slo, refusal_header=args.refusal_header,
        queue_header=args.queue_header, headers=tuple(args.header), sweep=args.sweep,
        sweep_steps=args.sweep_steps, sweep_factor=args.sweep_factor,
        sweep_resolution=args.sweep_resolution,
    )  # fmt: skip


def _usage_error(error: SpecError) -> int:
    print(f"{PROG}: error: {error}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """Run what the parsed flags say; the exit status."""
    if getattr(args, "bench_command", None) == "compare":
        try:
            a, b = load_run(args.a), load_run(args.b)
        except ValueError as err:
            print(f"{PROG} compare: {err}", file=sys.stderr)
            return 2
        print(render_comparison(a, b, args.a, args.b), end="")
        return 0
    try:
        spec = spec_from_args(args)
    except SpecError as err:
        return _usage_error(err)
    progress = sys.stderr if sys.stderr.isatty() and not args.quiet else None
    try:
        result = run_bench_sync(spec, progress)
    except SpecError as err:
        return _usage_error(err)
    except BenchError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    document = result.to_json()
    print(render(document), end="")
    if args.json:
        Path(args.json).write_text(json.dumps(document, indent=2) + "\n")
    if args.plot:
        write_plot(document, args.plot)
    if spec.sweep:
        return 0 if document["capacity"]["met"] else EXIT_SLO_MISSED
    slo = document.get("slo")
    return EXIT_SLO_MISSED if slo is not None and not slo["met"] else 0
