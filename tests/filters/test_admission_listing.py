"""tenant_listing: which listing requests a limited tenant gets answered by ext_proc."""

from __future__ import annotations

import json

from sluicegate.config import load_config_text
from sluicegate.filters import RoutingTable
from sluicegate.filters.admission.listing import tenant_listing
from sluicegate.model import build_model

from .admission_helpers import HEAD, decode
from .helpers import error_of

TABLE = RoutingTable.from_model(
    build_model(
        load_config_text(
        HEAD
        + """\
routes:
  - {name: chat, models: [a, b, shared], backends: [{provider: alpha}]}
  - {name: second, models: [c, shared], path_prefix: /openai/v1, backends: [{provider: beta}]}
""",
            "x.yaml",
        ),
        {},
    )
)


def ids(answer: bytes | None) -> list[str]:
    assert answer is not None
    immediate = decode(answer).immediate_response
    assert immediate.status.code == 200
    return [entry["id"] for entry in json.loads(immediate.body)["data"]]


def test_models_under_each_prefix() -> None:
    assert TABLE.models_under() == {
        "/v1/": frozenset({"a", "b", "shared"}),
        "/openai/v1/": frozenset({"c", "shared"}),
    }


def test_each_prefix_lists_its_own_models_the_tenant_may_use() -> None:
    allowed = frozenset({"b", "c", "shared"})
    served = TABLE.models_under()
    assert ids(tenant_listing("GET", "/v1/models", served, allowed)) == ["b", "shared"]
    assert ids(tenant_listing("GET", "/openai/v1/models", served, allowed)) == ["c", "shared"]
    assert ids(tenant_listing("GET", "/v1/models", served, frozenset({"zzz"}))) == []


def test_a_model_the_tenant_may_not_use_does_not_exist_for_it() -> None:
    served = TABLE.models_under()
    status, err = error_of(decode(tenant_listing("GET", "/v1/models/a", served, frozenset())))
    assert (status, err["code"]) == (404, "model_not_found")
    # c is served, but not under /v1/: Envoy's 404 answers that already.
    assert tenant_listing("GET", "/v1/models/c", served, frozenset()) is None
    assert tenant_listing("GET", "/v1/models/b", served, frozenset({"b"})) is None


def test_not_a_listing() -> None:
    served = TABLE.models_under()
    for method, path in (
        ("POST", "/v1/models"),
        ("GET", "/v1/chat/completions"),
        ("GET", "/v1/modelsx"),
        ("GET", None),
        (None, "/v1/models"),
    ):
        assert tenant_listing(method, path, served, frozenset()) is None
