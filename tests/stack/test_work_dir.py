"""The work directory: private to its user, never through a symlink."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluicegate.stack.work_dir import _private_folder


def test_a_symlink_planted_where_the_folder_goes_is_refused(tmp_path: Path) -> None:
    """Another user could plant one in /tmp, pointing at a folder of ours that `up`
    would fill and remove on a clean exit."""
    target = tmp_path / "precious"
    target.mkdir()
    planted = tmp_path / "sluicegate-up-1000-0123456789abcdef"
    planted.symlink_to(target)
    with pytest.raises(RuntimeError, match="symlink"):
        _private_folder(planted)
    assert target.exists()


def test_the_folder_is_made_private(tmp_path: Path) -> None:
    folder = _private_folder(tmp_path / "work")
    assert folder.stat().st_mode & 0o777 == 0o700
