"""`native_filters.module` to the library Envoy is told to load (sluicegate.native)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sluicegate.native import MODULE, SCANNER, NativeBuildError, build, resolve_module


def test_off_is_envoys_own_filters() -> None:
    assert resolve_module("off").path is None


def test_a_path_is_taken_as_envoy_has_it() -> None:
    """Not checked here: the control plane may not see Envoy's file system."""
    module = resolve_module("/opt/elsewhere/libsluicegate_native.so")
    assert module.path == "/opt/elsewhere/libsluicegate_native.so"


def test_auto_builds_once_and_then_finds_the_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = resolve_module("auto")
    assert first.path is not None and first.path.startswith(str(tmp_path))
    built = Path(first.path)
    stamp = built.stat().st_mtime_ns
    assert resolve_module("auto") == first
    assert built.stat().st_mtime_ns == stamp  # not built again
    assert built.read_bytes().startswith(b"\x7fELF")


def test_the_library_may_be_loaded_by_another_user(tmp_path: Path) -> None:
    """Envoy often runs as its own user (an image's `envoy`): the library is readable and
    executable by all, not left with the temporary file's 0600."""
    library = build(MODULE, tmp_path)
    assert library.stat().st_mode & 0o777 == 0o755


def test_a_folder_that_cannot_be_written_is_a_build_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """So `auto` falls back to Envoy's filters instead of the control plane failing."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker / "below"))
    module = resolve_module("auto")
    assert module.path is None
    assert "cannot build" in module.why and "Envoy's own" in module.why


def test_a_relative_folder_gives_an_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`native_filters.module` takes absolute paths only."""
    monkeypatch.chdir(tmp_path)
    assert build(MODULE, Path("out")).is_absolute()


def test_auto_without_a_compiler_falls_back_to_envoys_filters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))  # no gcc on it
    module = resolve_module("auto")
    assert module.path is None
    assert "no gcc" in module.why


def test_a_failed_build_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compiler error is NativeBuildError with the compiler's words, and no partial
    library stays where a later build would find it."""
    broken = tmp_path / "c"
    broken.mkdir()
    (broken / "usage_scanner.c").write_text("this is not C\n")
    # The module, not the package's `build` (the function of the same name).
    monkeypatch.setattr(sys.modules["sluicegate.native.library"], "SOURCE_DIR", broken)
    with pytest.raises(NativeBuildError, match="gcc failed building"):
        build(SCANNER, tmp_path / "out")
    assert not list((tmp_path / "out").rglob("*.so"))
    # What the control plane shows: the compiler's own words, not only that it failed.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    module = resolve_module("auto")
    assert module.path is None and "error" in module.why and "this is not C" in module.error
