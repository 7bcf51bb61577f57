"""settle_heap: the objects alive once a server is up leave the collector's walk."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from sluicegate.stack.heap import DEFAULTS_ENV, settle_heap


@pytest.fixture(autouse=True)
def _unfreeze() -> Iterator[None]:
    yield
    gc.unfreeze()  # leave the rest of the test session's collector as it found it


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector can free it


def test_survivors_are_frozen_and_garbage_is_still_collected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(DEFAULTS_ENV, raising=False)
    kept = [_Node() for _ in range(100)]
    frozen = settle_heap()
    assert frozen >= 100
    walked = {id(obj) for obj in gc.get_objects()}  # what a full collection walks
    assert not any(id(node) in walked for node in kept)
    # Made after settling: walked and collected as usual.
    gc.collect()
    [_Node() for _ in range(50)]
    assert gc.collect() >= 50


def test_defaults_env_leaves_the_collector_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEFAULTS_ENV, "1")
    before = gc.get_freeze_count()
    assert settle_heap() == 0
    assert gc.get_freeze_count() == before
