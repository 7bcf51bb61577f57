"""What a native node class costs the control plane per reload: its clusters, listeners
and filter configurations translated again for the library (translate.translate_native,
through the class's own RouteMemo: stack/native_nodes.py), against the default
translation (translate, with its memo), on xds_push's gateway of N routes.

Not collected by pytest. Run:  python -m benchmarks.native_translation [--routes N] [--reps K]

Per kind, the median of K runs, each with fresh memos: the first translation, one route
added (the memo reuses the others), every route renamed (nothing reused).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from benchmarks.harness.stack import Ports
from benchmarks.xds_push import PROVIDERS, gateway_doc
from sluicegate.config import load_config
from sluicegate.model import Gateway, build_model
from sluicegate.xds.translate import RouteMemo, translate, translate_native
from sluicegate.xds.translate.envoy_routing import fast_lane_extensions
from sluicegate.xds.translate.listeners import build_listeners

LIBRARY = "/opt/sluicegate/libsluicegate_native.so"  # a path: nothing loads it here


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--routes", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    ports = Ports.pick(PROVIDERS)
    work = Path(tempfile.mkdtemp(prefix="native-translation-"))

    def model(generation: int, probes: tuple[int, ...]) -> Gateway:
        path = work / f"g{generation}-{len(probes)}.yaml"
        doc = gateway_doc(args.routes, ports, generation=generation, probes=probes)
        path.write_text(yaml.safe_dump(doc))
        return build_model(load_config(path), {})

    steps = (("first", model(0, ())), ("one route added", model(0, (1,))),
             ("all renamed", model(1, (1,))))  # fmt: skip
    arms: dict[str, Callable[[Gateway, RouteMemo], object]] = {
        "default (translate)": lambda m, memo: translate(m, memo),
        "a native class (translate_native)": lambda m, memo: translate_native(
            dataclasses.replace(m, native_module=LIBRARY), memo
        ),
        # What a class cost before its clusters were translated again (session 21).
        "its listeners and filter configurations alone": lambda m, memo: (
            build_listeners(dataclasses.replace(m, native_module=LIBRARY)),
            list(fast_lane_extensions(dataclasses.replace(m, native_module=LIBRARY))),
        ),
    }
    print(f"{args.routes} routes, median of {args.reps} runs, seconds")
    print("| translation | " + " | ".join(name for name, _ in steps) + " |")
    print("|---|" + "---:|" * len(steps))
    for arm, run in arms.items():
        times: dict[str, list[float]] = {name: [] for name, _ in steps}
        for _ in range(args.reps):
            memo = RouteMemo()
            for name, gateway in steps:
                started = time.perf_counter()
                run(gateway, memo)
                times[name].append(time.perf_counter() - started)
        cells = " | ".join(f"{statistics.median(times[name]):.3f}" for name, _ in steps)
        print(f"| {arm} | {cells} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
