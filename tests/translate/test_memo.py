"""RouteMemo: a translation that reuses unchanged routes gives exactly the fresh output."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from sluicegate.config import load_config_text
from sluicegate.model import build_model
from sluicegate.xds.translate import RouteMemo, translate

from .cases import CASES


def _serialized(resources: dict[str, list[Any]]) -> dict[str, list[bytes]]:
    return {
        type_url: [m.SerializeToString(deterministic=True) for m in items]
        for type_url, items in resources.items()
    }


def _ir(text: str, keys: dict[str, str | None]) -> Any:
    return build_model(load_config_text(text, "case.yaml"), keys)


@pytest.mark.parametrize("name", sorted(CASES))
def test_memo_gives_the_fresh_output_and_reuses_every_route(name: str) -> None:
    text, keys = CASES[name]
    ir = _ir(text, keys)
    memo = RouteMemo()
    first = _serialized(translate(ir, memo))
    assert first == _serialized(translate(ir))
    built = memo.misses
    assert built > 0 and memo.hits == 0  # the first translation built through the memo
    second = _serialized(translate(_ir(text, keys), memo))  # equal IR, new objects
    assert second == first
    assert memo.misses == built  # nothing rebuilt
    assert memo.hits == built  # every piece reused


def _edits(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Documents that each differ from `doc` in one thing a route's resources depend on."""
    edits = []
    renamed = copy.deepcopy(doc)
    renamed["routes"][0]["name"] += "-renamed"
    edits.append(renamed)
    retried = copy.deepcopy(doc)
    retried["routes"][0]["retries"] = {"max_retries": 4}
    edits.append(retried)
    moved = copy.deepcopy(doc)
    first_provider = moved["providers"][0]
    first_provider["base_url"] = first_provider["base_url"].replace("/v1", "/v2")
    edits.append(moved)
    limited = copy.deepcopy(doc)
    limited["limits"] = {"max_request_body_bytes": 65536}
    edits.append(limited)
    added = copy.deepcopy(doc)
    extra = copy.deepcopy(added["routes"][0])
    extra["name"] = "extra-route"
    extra["models"] = ["extra-model"]
    added["routes"].append(extra)
    edits.append(added)
    if doc.get("tenants"):
        # A tenant fewer can move a gate between Envoy and the routing stage, or unsplit
        # Envoy's (model.EnvoyGate): the route's cluster and model routes change with it.
        fewer = copy.deepcopy(doc)
        fewer["tenants"].pop(0)
        edits.append(fewer)
    return edits


@pytest.mark.parametrize("name", sorted(CASES))
def test_after_any_edit_the_memo_output_equals_a_fresh_translation(name: str) -> None:
    text, keys = CASES[name]
    memo = RouteMemo()
    translate(_ir(text, keys), memo)
    for edited in _edits(yaml.safe_load(text)):
        edited_text = yaml.safe_dump(edited, sort_keys=False)
        ir = _ir(edited_text, keys)
        assert _serialized(translate(ir, memo)) == _serialized(translate(ir))
        hits = memo.hits
        translate(_ir(text, keys), memo)  # back to the original, from the memo
        assert memo.hits > hits
