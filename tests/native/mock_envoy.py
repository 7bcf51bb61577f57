"""Building and running the tests' mocks of Envoy's side of the dynamic module ABI
(glue_harness.c, model_harness.c): C programs that drive the library's filters as Envoy
does, built with gcc here, with AddressSanitizer and UBSan when gcc has them."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Final

import pytest

from sluicegate.native import SOURCE_DIR

SANITIZERS: Final = ("-fsanitize=address,undefined", "-fno-sanitize-recover=all")
RUN_TIMEOUT_S: Final = 60.0


def build_mock(harness: Path, sources: Iterable[str], target: Path) -> Path:
    """`harness` built with the library's `sources` (names in SOURCE_DIR) into `target`;
    skips the test without gcc."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("no gcc on PATH to build the mock-Envoy harness")
    base = [gcc, "-std=c11", "-g", "-O1", "-Wall", "-Wextra", "-Werror",
            "-Wno-unused-parameter", f"-I{SOURCE_DIR}", "-o", str(target), str(harness),
            *(str(SOURCE_DIR / name) for name in sources)]  # fmt: skip
    probe = subprocess.run([*base, *SANITIZERS], capture_output=True, text=True, check=False)
    if probe.returncode != 0:  # no sanitizer runtime: the harness alone still tests
        done = subprocess.run(base, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
    return target


def run_mock(harness: Path, *arguments: str, stdin: str = "") -> str:
    """The mock's output; fails the test on a failed check or a sanitizer's report."""
    done = subprocess.run(
        [str(harness), *arguments], input=stdin, capture_output=True, text=True,
        timeout=RUN_TIMEOUT_S, check=False,
        env={"ASAN_OPTIONS": "detect_leaks=1", "UBSAN_OPTIONS": "print_stacktrace=1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert "runtime error" not in done.stderr, done.stderr[-4000:]
    return done.stdout
