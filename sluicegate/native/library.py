"""Building sluicegate's native filters: C compiled with the machine's gcc into a shared
library Envoy loads as a dynamic module (docs/native-filters.md).

A build is cached by the hash of its sources and flags, under the user's cache directory,
so the control plane and `sluicegate up` build once per source change; a failed build (no
gcc, say) raises NativeBuildError with the compiler's words, and the callers fall back to
Envoy's own filters.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Final

SOURCE_DIR: Final = Path(__file__).parent / "c"
COMPILER: Final = "gcc"
# Warnings are errors: a module that crashes takes its Envoy down. Bound now (-z now):
# Envoy opens a module lazily, so a callback it does not export would otherwise kill it
# at the first request that calls it, instead of failing the load.
FLAGS: Final = (
    "-O2", "-std=c11", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter",
    "-shared", "-fPIC", "-fvisibility=hidden", "-Wl,-z,now",
    "-fstack-protector-strong", "-D_FORTIFY_SOURCE=2",
)  # fmt: skip
BUILD_TIMEOUT_S: Final = 120.0


class NativeBuildError(RuntimeError):
    """The library could not be built (the reason is the message)."""


@dataclass(frozen=True, slots=True)
class Library:
    """A shared library built from some of SOURCE_DIR's C files."""

    name: str  # the file name, lib<name>.so
    sources: tuple[str, ...]  # file names in SOURCE_DIR


# What Envoy loads: every filter with its glue to Envoy's ABI, and the hooks (module.c).
MODULE: Final = Library(
    "sluicegate_native",
    ("usage_scanner.c", "usage_filter.c", "model_walk.c", "model_filter.c",
     "forwarded_headers.c", "module.c"),
)
# The scanner alone, without Envoy's symbols, for tests that call it through ctypes.
SCANNER: Final = Library("sluicegate_usage_scanner", ("usage_scanner.c",))


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sluicegate" / "native"


def build(library: Library = MODULE, into: Path | None = None) -> Path:
    """The absolute path of `library`, built now unless a build of the same sources is
    cached in `into` (default: cache_dir()). NativeBuildError when it cannot be built:
    no compiler, a compiler error (its words in the message), or a folder that cannot be
    written."""
    compiler = shutil.which(COMPILER)
    if compiler is None:
        raise NativeBuildError(f"no {COMPILER} on PATH to build the native filters")
    try:
        return _build(compiler, library, (into or cache_dir()).absolute())
    except OSError as error:
        raise NativeBuildError(f"cannot build {library.name}: {error}") from error


def _build(compiler: str, library: Library, into: Path) -> Path:
    digest = hashlib.sha256(" ".join(FLAGS).encode())
    for path in sorted(SOURCE_DIR.iterdir()):
        if path.suffix in (".c", ".h"):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    # A new folder per source version: a library Envoy has loaded is never overwritten
    # (and Envoy would not load a changed one again from the same path).
    target = into / digest.hexdigest()[:16] / f"lib{library.name}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Built beside the target and renamed into place: a reader never sees half a file.
    with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".so", delete=False) as partial:
        pass
    command = [compiler, *FLAGS, "-o", partial.name,
               *(str(SOURCE_DIR / source) for source in library.sources)]  # fmt: skip
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False
        )
        if done.returncode != 0:
            raise NativeBuildError(f"{COMPILER} failed building {library.name}:\n{done.stderr}")
        # The temporary file is the owner's alone (0600): Envoy may run as another user.
        os.chmod(partial.name, 0o755)
        os.replace(partial.name, target)
    except subprocess.TimeoutExpired as error:
        raise NativeBuildError(f"{COMPILER} took over {BUILD_TIMEOUT_S:.0f} s") from error
    finally:
        Path(partial.name).unlink(missing_ok=True)
    return target
