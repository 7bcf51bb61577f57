"""`sluicegate bench`: a load tester for OpenAI-compatible endpoints (docs/bench.md).

Python callers: build a `BenchSpec`, `await run_bench(spec)` (or `run_bench_sync`), read
the `BenchResult` (`to_json()` is the `--json` file). The command: `add_arguments` and
`run` (sluicegate/cli.py). Stands alone: imports nothing of sluicegate but its own
modules, like `provider/`.
"""

from sluicegate.bench.cli import add_arguments, run
from sluicegate.bench.result import BenchResult
from sluicegate.bench.runner import run_bench, run_bench_sync
from sluicegate.bench.spec import BenchSpec, Scenario, SpecError
from sluicegate.bench.workers import BenchError

__all__ = [
    "BenchError",
    "BenchResult",
    "BenchSpec",
    "Scenario",
    "SpecError",
    "add_arguments",
    "run",
    "run_bench",
    "run_bench_sync",
]
