"""The `sluicegate` command: up | control-plane | ext-proc | validate | bootstrap |
mock-provider | status | drain | hash-key | native-build | bench."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, NoReturn


def _cmd_up(args: argparse.Namespace) -> int:
    from sluicegate.stack import UpOptions, run_up

    options = UpOptions(
        config_path=Path(args.config),
        ads_mode=args.ads_mode,
        node_id=args.node_id,
        envoy_concurrency=args.envoy_concurrency,
        start_envoy=not args.no_envoy,
        start_mocks=not args.no_mocks,
        work_dir=Path(args.work_dir) if args.work_dir else None,
    )
    return _run_async(run_up(options))


def _run_async(main: Coroutine[Any, Any, int]) -> int:
    """Run a server's main coroutine on uvloop (docs/architecture.md, "Process model")."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.run(main)
    return uvloop.run(main)


def _cmd_validate(args: argparse.Namespace) -> int:
    from sluicegate.config import describe_lanes, validate_file

    failed = False
    for name in args.files:
        problems = validate_file(Path(name))
        for problem in problems:
            print(problem, file=sys.stderr)
        errors = [p for p in problems if getattr(p, "severity", "error") == "error"]
        failed = failed or bool(errors)
        if not errors:
            print(f"{name}: valid" + (f" ({len(problems)} warnings)" if problems else ""))
            for line in [*describe_lanes(Path(name)), *_held_models(Path(name))]:
                print("  " + line)
    return 1 if failed else 0


def _held_models(path: Path) -> list[str]:
    """For `validate`: the models an `auto` tenant's requests for always take the exact
    lane (model.Gateway.held_models), and the gates Envoy enforces (model.EnvoyGate)."""
    from sluicegate.config import LANE_AUTO, load_config
    from sluicegate.model import build_model

    cfg = load_config(path)
    gateway = build_model(cfg, {})
    lines = [
        f"route {route.name}'s gate: Envoy's (only fast-lane requests reach it): "
        + route.envoy_gate.describe()
        for route in gateway.routes
        if route.envoy_gate is not None
    ]
    if any(cfg.admission.lane_of(tenant) == LANE_AUTO for tenant in cfg.tenants):
        lines += [
            f"model {model}: auto tenants' requests take the exact lane ({why})"
            for model, why in gateway.held_models.items()
        ]
    return lines


def _cmd_ext_proc(args: argparse.Namespace) -> int:
    from sluicegate.stack.replica import run_ext_proc

    last_good = Path(args.last_good) if args.last_good else None
    return _run_async(
        run_ext_proc(
            Path(args.config), args.address, None, args.http, last_good, args.control_plane
        )
    )


def _cmd_control_plane(args: argparse.Namespace) -> int:
    from sluicegate.stack.control_plane_server import run_control_plane

    return _run_async(
        run_control_plane(
            Path(args.config),
            xds_address=args.xds,
            http_address=args.http,
            drained_file=Path(args.drained_file) if args.drained_file else None,
        )
    )


def _cmd_bootstrap(args: argparse.Namespace) -> int:
    from sluicegate.envoy import bootstrap_json, bootstrap_yaml

    # JSON by default: Envoy reads a path without .yaml (`envoy -c <(sluicegate bootstrap
    # ...)` gives it /dev/fd/63) as JSON only. `--format yaml` is the commented version.
    render = bootstrap_yaml if args.format == "yaml" else bootstrap_json
    native_module = args.native_module
    if native_module == "build":
        # For an Envoy on this machine: build here, name what was built.
        from sluicegate.native import MODULE, NativeBuildError, build

        try:
            native_module = str(build(MODULE))
        except NativeBuildError as err:
            print(f"sluicegate bootstrap: {err}", file=sys.stderr)
            return 1
    elif native_module is not None and not native_module.startswith("/"):
        print(
            "sluicegate bootstrap: --native-module takes `build` or the library's absolute "
            f"path on Envoy's machine, not {native_module!r}",
            file=sys.stderr,
        )
        return 2
    print(
        render(
            node_id=args.node_id,
            cluster=args.cluster,
            xds_address=args.control_plane,
            ext_proc_address=args.ext_proc or ["127.0.0.1:18001"],
            admin_address=args.admin,
            ads_mode=args.ads_mode,
            native_module=native_module,
        )
    )
    return 0


def _cmd_mock_provider(args: argparse.Namespace) -> int:
    from sluicegate.provider import run_mock_provider, settings_from_args

    try:
        settings = settings_from_args(args)
    except ValueError as err:
        print(f"sluicegate mock-provider: {err}", file=sys.stderr)
        return 2
    run_mock_provider(settings)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    """`up`'s /status as text (stack/status_text.py) or, with --json, as it is; exits 1
    on any of its problems, each named on stderr."""
    from sluicegate.stack import render_status, status_problems

    url = f"http://{args.address}/status"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            document = json.load(response)
    except (OSError, ValueError) as err:
        print(f"cannot reach sluicegate at {url}: {err}", file=sys.stderr)
        return 1
    if not isinstance(document, dict):
        print(f"sluicegate at {url} answered no status document", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        print(render_status(document, time.time()), end="")
    found = status_problems(document)
    for problem in found:
        print(problem, file=sys.stderr)
    return 1 if found else 0


def _cmd_drain(args: argparse.Namespace) -> int:
    url = f"http://{args.address}/drain/{args.provider}"
    request = urllib.request.Request(url, method="DELETE" if args.undo else "POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            document = json.load(response)
    except urllib.error.HTTPError as err:
        print(f"sluicegate drain: {json.load(err).get('error', err)}", file=sys.stderr)
        return 1
    except OSError as err:
        print(f"cannot reach sluicegate at {url}: {err}", file=sys.stderr)
        return 1
    print(f"drained: {', '.join(document['drained']) or '(none)'}")
    return 0


def _cmd_hash_key(args: argparse.Namespace) -> int:
    """Print the hash to paste under tenants[].keys[]; the key goes only to stdout, and
    only when --generate made it (the user must hand it to the client)."""
    from sluicegate.config import generate_key, hash_key

    if args.generate:
        if args.key is not None:
            print("sluicegate hash-key: give KEY or --generate, not both", file=sys.stderr)
            return 2
        key = generate_key()
    elif args.key is not None:
        key = args.key.strip()
    elif sys.stdin.isatty():
        import getpass

        try:
            key = getpass.getpass("API key to hash: ").strip()
        except (EOFError, KeyboardInterrupt):
            key = ""
    else:
        key = sys.stdin.readline().strip()
    if not key:
        print(
            "sluicegate hash-key: the key is empty; pass it as KEY, on stdin, or use --generate",
            file=sys.stderr,
        )
        return 2
    if args.generate:
        print("# New API key: give it to the client. It is shown only now; the config keeps")
        print("# only its hash, so it cannot be recovered later.")
        print(f"key: {key}")
        print("# Paste under tenants[].keys[] (with a name:) in the config:")
    print(f'hash: "{hash_key(key)}"')
    return 0


def _cmd_native_build(args: argparse.Namespace) -> int:
    """Build the native filters library (gcc) and print its path, for an Envoy on another
    machine (`sluicegate bootstrap --native-module <that path>`, or `native_filters.module:
    <that path>`; docs/native-filters.md)."""
    from sluicegate.native import MODULE, NativeBuildError, build

    try:
        path = build(MODULE, Path(args.into).absolute() if args.into else None)
    except NativeBuildError as err:
        print(f"sluicegate native-build: {err}", file=sys.stderr)
        return 1
    print(path)
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from sluicegate import bench

    return bench.run(args)


def build_parser() -> argparse.ArgumentParser:
    from sluicegate.provider import add_mock_provider_arguments

    parser = _QuietParser(prog="sluicegate", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="start control plane, ext_proc, mocks and Envoy")
    up.add_argument("config", help="the YAML file, e.g. examples/quickstart.yaml")
    up.add_argument("--ads-mode", choices=["sotw", "delta"], default="sotw")
    up.add_argument("--node-id", default="sluicegate-gateway")
    up.add_argument("--envoy-concurrency", type=int, default=2)
    up.add_argument("--no-envoy", action="store_true", help="control plane only (sidecars)")
    up.add_argument("--no-mocks", action="store_true", help="do not start mock providers")
    up.add_argument(
        "--work-dir",
        help="where the logs, Envoy's bootstrap, the sockets and stack.json go; the next up "
        "on it adopts the children of one that was killed (default: a folder of yours in "
        "the temp directory, the same for the same config file, removed on a clean exit)",
    )
    up.set_defaults(func=_cmd_up)

    replica = sub.add_parser(
        "ext-proc", help="run one more ext_proc server for the config (a replica)"
    )
    replica.add_argument("config", help="the same YAML file the control plane reads")
    replica.add_argument("--address", default="127.0.0.1:18001", help="listen on HOST:PORT")
    replica.add_argument(
        "--control-plane",
        help="send the auto lane's usage notes to the control plane at HOST:PORT (default: "
        "the config's sluicegate.xds, a wildcard host as the loopback)",
    )
    replica.add_argument(
        "--http",
        "--metrics",
        help="serve its /metrics and /status on HOST:PORT or unix:/path (default: none)",
    )
    replica.add_argument(
        "--last-good",
        help="keep the file's last good version here, and serve it when the file is invalid "
        "at start (as after a crash)",
    )
    replica.set_defaults(func=_cmd_ext_proc)

    plane = sub.add_parser(
        "control-plane",
        help="run the control plane alone: xDS for Envoy, /status, /metrics, /drain",
    )
    plane.add_argument("config", help="the YAML file, e.g. examples/quickstart.yaml")
    plane.add_argument("--xds", help="serve ADS on HOST:PORT (default: the file's sluicegate.xds)")
    plane.add_argument(
        "--http", help="serve its endpoint on HOST:PORT or unix:/path (default: sluicegate.http)"
    )
    plane.add_argument(
        "--drained-file",
        help="keep live drains in this file, so a restarted control plane keeps them",
    )
    plane.set_defaults(func=_cmd_control_plane)

    validate = sub.add_parser("validate", help="check config files; exit 1 on any error")
    validate.add_argument("files", nargs="+")
    validate.set_defaults(func=_cmd_validate)

    boot = sub.add_parser("bootstrap", help="print the bootstrap for an Envoy started elsewhere")
    boot.add_argument("--node-id", required=True)
    boot.add_argument("--cluster", default="sluicegate")
    boot.add_argument("--control-plane", default="127.0.0.1:18000", help="xDS HOST:PORT")
    boot.add_argument(
        "--ext-proc",
        action="append",
        help="ext_proc HOST:PORT; repeat for replicas (default 127.0.0.1:18001)",
    )
    boot.add_argument(
        "--admin", default="127.0.0.1:9901", help="Envoy admin HOST:PORT or unix:/path"
    )
    boot.add_argument("--ads-mode", choices=["sotw", "delta"], default="sotw")
    boot.add_argument(
        "--native-module",
        metavar="PATH|build",
        help="the native filters library on Envoy's machine (from `sluicegate native-build`), "
        "or `build` to build it here for an Envoy on this machine; named in the node's "
        "metadata, so a control plane with native_filters.module: node (the default) "
        "serves this Envoy listeners that load it",
    )
    boot.add_argument(
        "--format",
        choices=["json", "yaml"],
        default="json",
        help="json (default) works as `envoy -c <(sluicegate bootstrap ...)` and in any "
        "file; yaml is commented, for reading or a file named *.yaml",
    )
    boot.set_defaults(func=_cmd_bootstrap)

    mock = sub.add_parser("mock-provider", help="run a mock OpenAI-compatible provider")
    add_mock_provider_arguments(mock)
    mock.set_defaults(func=_cmd_mock_provider)

    drain = sub.add_parser("drain", help="move new traffic off a provider (in-flight finishes)")
    drain.add_argument("provider")
    drain.add_argument("--undo", action="store_true", help="put the provider back in rotation")
    drain.add_argument("--address", default="127.0.0.1:9100", help="sluicegate HTTP HOST:PORT")
    drain.set_defaults(func=_cmd_drain)

    hash_key = sub.add_parser(
        "hash-key",
        help="hash a client API key for tenants[].keys[].hash (or make a new key)",
        description="Print the salted SHA-256 of a client API key as the YAML line to paste "
        "under tenants[].keys[]. The key comes from KEY, else from one line of stdin (a "
        "hidden prompt on a terminal); prefer stdin, since KEY stays in shell history.",
    )
    hash_key.add_argument("key", nargs="?", metavar="KEY", help="the key (default: read stdin)")
    hash_key.add_argument(
        "--generate", action="store_true", help="make a new random key; print it and its hash"
    )
    hash_key.set_defaults(func=_cmd_hash_key)

    status = sub.add_parser(
        "status",
        help="show the config, Envoy nodes and NACKs, providers' health and weights, every "
        "process and admission; exit 1 on a problem",
    )
    status.add_argument("--address", default="127.0.0.1:9100", help="sluicegate HTTP HOST:PORT")
    status.add_argument("--json", action="store_true", help="print up's /status document as JSON")
    status.set_defaults(func=_cmd_status)

    native = sub.add_parser(
        "native-build",
        help="build the native filters library Envoy loads (gcc) and print its path",
    )
    native.add_argument(
        "--into", help="the folder to build in (default: the user's cache, ~/.cache/sluicegate)"
    )
    native.set_defaults(func=_cmd_native_build)

    from sluicegate import bench

    load = sub.add_parser(
        "bench", help="load-test an OpenAI-compatible endpoint; `bench compare A.json B.json`"
    )
    bench.add_arguments(load)
    load.set_defaults(func=_cmd_bench)
    return parser


class _QuietParser(argparse.ArgumentParser):
    """An ArgumentParser (its subcommands' too) whose errors never quote a value given on
    the command line: after a mistyped flag the value may be a key (`--api-kye sk-…`),
    and argparse would print it ("invalid choice: 'sk-…'")."""

    given: tuple[str, ...] = ()

    def error(self, message: str) -> NoReturn:
        for token in sorted(self.given, key=len, reverse=True):
            value = token.split("=", 1)[1] if token.startswith("-") and "=" in token else token
            if len(value) >= 4 and not value.startswith("-"):
                message = message.replace(value, "…")  # quoted or not ("--api=sk-…")
        super().error(message)


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """argparse's parse_args, except that arguments it does not know are named by their
    flags alone and no error quotes a value (_QuietParser)."""
    _QuietParser.given = tuple(sys.argv[1:] if argv is None else argv)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        flags = [token.split("=", 1)[0] for token in unknown if token.startswith("-")]
        shown = " ".join(flags) if flags else f"{len(unknown)} value(s), not shown"
        parser.error(f"unrecognized arguments: {shown}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(build_parser(), argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
