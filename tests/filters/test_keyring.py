"""Client keys: reading the key off the request headers, and matching it to a tenant."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from sluicegate.filters.admission import ClientIdentity, KeyRing, keyring, presented_key

from .admission_helpers import hashed

# ----- presented_key ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "key"),
    [
        ({"authorization": "Bearer sk-abc"}, "sk-abc"),
        ({"authorization": "bearer sk-abc"}, "sk-abc"),
        ({"authorization": "BEARER sk-abc"}, "sk-abc"),
        ({"authorization": "BeArEr sk-abc"}, "sk-abc"),
        ({"authorization": "Bearer    sk-abc  \t"}, "sk-abc"),
        ({"x-api-key": "sk-anthropic"}, "sk-anthropic"),
        ({"x-api-key": "  sk-anthropic "}, "sk-anthropic"),
        ({"api-key": "sk-azure"}, "sk-azure"),
        ({"x-api-key": "first", "api-key": "second"}, "first"),
        # Bearer wins over the other conventions.
        ({"authorization": "Bearer sk-bearer", "x-api-key": "sk-other"}, "sk-bearer"),
    ],
)
def test_presented_key_reads_each_convention(headers: dict[str, str], key: str) -> None:
    assert presented_key(headers) == key


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"authorization": "Basic dXNlcjpwYXNz"},
        {"authorization": "Token sk-abc"},
        {"authorization": "sk-abc"},
        # A non-Bearer Authorization is not a key, even beside an x-api-key.
        {"authorization": "Basic dXNlcjpwYXNz", "x-api-key": "sk-other"},
        {"authorization": "Bearer"},
        {"authorization": "Bearer "},
        {"authorization": "Bearer    "},
        {"authorization": ""},
        {"x-api-key": ""},
        {"x-api-key": "   "},
        {"api-key": ""},
        {"other": "Bearer sk-abc"},
    ],
)
def test_presented_key_none_when_no_usable_key(headers: dict[str, str]) -> None:
    assert presented_key(headers) is None


# ----- KeyRing ---------------------------------------------------------------------------

KEYS = {
    ("alpha", "alpha-laptop"): "sk-alpha-laptop-0001",
    ("alpha", "alpha-ci"): "sk-alpha-ci-0002",
    ("beta", "beta-main"): "sk-beta-main-0003",
}


def ring() -> KeyRing:
    return KeyRing((tenant, name, hashed(key)) for (tenant, name), key in KEYS.items())


class CountingHashlib:
    """Stands in for the module's `hashlib`, counting sha256 calls."""

    def __init__(self) -> None:
        self.calls = 0

    def sha256(self, data: bytes = b"") -> Any:
        self.calls += 1
        return hashlib.sha256(data)

    def take(self) -> int:
        calls, self.calls = self.calls, 0
        return calls


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> CountingHashlib:
    counter = CountingHashlib()
    monkeypatch.setattr(keyring, "hashlib", counter)
    return counter


def test_right_keys_identify_their_tenant_and_key_name() -> None:
    keys = ring()
    assert len(keys) == 3
    for (tenant, name), key in KEYS.items():
        assert keys.identify(key) == ClientIdentity(tenant, name)


def test_keys_of_two_tenants_stay_apart() -> None:
    keys = ring()
    assert keys.identify("sk-alpha-ci-0002") == ClientIdentity("alpha", "alpha-ci")
    assert keys.identify("sk-beta-main-0003") == ClientIdentity("beta", "beta-main")
    # Asking again (cached) keeps each answer.
    assert keys.identify("sk-beta-main-0003") == ClientIdentity("beta", "beta-main")
    assert keys.identify("sk-alpha-ci-0002") == ClientIdentity("alpha", "alpha-ci")


@pytest.mark.parametrize(
    "key",
    [
        "sk-alpha-laptop-000",  # a prefix of a right key
        "sk-alpha-laptop-00011",  # a right key plus one character
        "SK-ALPHA-LAPTOP-0001",  # case matters
        " sk-alpha-laptop-0001",
        "",
        "ключ",
    ],
)
def test_wrong_keys_identify_nobody(key: str) -> None:
    assert ring().identify(key) is None


def test_empty_ring_identifies_nobody() -> None:
    keys = KeyRing(())
    assert len(keys) == 0
    assert keys.identify("sk-anything") is None


def test_known_key_costs_one_hash_the_second_time(counting: CountingHashlib) -> None:
    keys = ring()
    last = KEYS["beta", "beta-main"]  # the third stored hash: every one is tried once
    assert keys.identify(last) == ClientIdentity("beta", "beta-main")
    assert counting.take() == 1 + 3  # the fingerprint, then each stored hash
    for _ in range(5):
        assert keys.identify(last) == ClientIdentity("beta", "beta-main")
        assert counting.take() == 1  # the fingerprint only


def test_first_matching_hash_stops_the_search(counting: CountingHashlib) -> None:
    keys = ring()
    assert keys.identify(KEYS["alpha", "alpha-laptop"]) == ClientIdentity("alpha", "alpha-laptop")
    assert counting.take() == 1 + 1


def test_unknown_key_costs_one_hash_the_second_time(counting: CountingHashlib) -> None:
    keys = ring()
    assert keys.identify("sk-wrong") is None
    assert counting.take() == 1 + 3
    for _ in range(5):
        assert keys.identify("sk-wrong") is None
        assert counting.take() == 1


def test_unknown_keys_are_remembered_up_to_a_bound_oldest_out_first(
    counting: CountingHashlib, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(keyring, "_UNKNOWN_REMEMBERED", 2)
    keys = ring()
    for wrong in ("wrong-a", "wrong-b", "wrong-c"):  # wrong-a leaves when wrong-c comes
        assert keys.identify(wrong) is None
    counting.take()
    assert keys.identify("wrong-c") is None
    assert keys.identify("wrong-b") is None
    assert counting.take() == 2  # both still remembered
    assert keys.identify("wrong-a") is None
    assert counting.take() == 1 + 3  # forgotten: every stored hash tried again


def test_unknown_key_seen_again_is_kept_over_older_ones(
    counting: CountingHashlib, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(keyring, "_UNKNOWN_REMEMBERED", 2)
    keys = ring()
    assert keys.identify("wrong-a") is None
    assert keys.identify("wrong-b") is None
    assert keys.identify("wrong-a") is None  # recently used again: now the newest
    assert keys.identify("wrong-c") is None  # so wrong-b leaves, not wrong-a
    counting.take()
    assert keys.identify("wrong-a") is None
    assert counting.take() == 1
    assert keys.identify("wrong-b") is None
    assert counting.take() == 1 + 3


def test_default_bound_of_unknown_keys_holds(counting: CountingHashlib) -> None:
    keys = ring()
    bound = keyring._UNKNOWN_REMEMBERED
    for index in range(bound + 1):  # one more than remembered: wrong-0 leaves
        assert keys.identify(f"wrong-{index}") is None
    counting.take()
    assert keys.identify("wrong-1") is None
    assert keys.identify(f"wrong-{bound}") is None
    assert counting.take() == 2
    assert keys.identify("wrong-0") is None
    assert counting.take() == 1 + 3


def test_right_key_is_never_taken_for_a_remembered_wrong_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(keyring, "_UNKNOWN_REMEMBERED", 1)
    keys = ring()
    assert keys.identify("wrong") is None
    assert keys.identify("other-wrong") is None
    assert keys.identify(KEYS["alpha", "alpha-ci"]) == ClientIdentity("alpha", "alpha-ci")


def test_a_client_envoy_named_is_trusted_only_for_a_key_of_the_ring() -> None:
    """With Envoy checking keys (docs/fast-lane.md, "A lane per tenant") the routing stage
    reads the client Envoy named; one the ring does not hold (a key a reload just
    removed, a tenant of another key) is refused as its key would be."""
    ring = KeyRing([("team", "ci", hashed("sk-sg-ci"))])
    assert ring.named("exact/team/ci") == ClientIdentity("team", "ci")
    assert ring.named("exact/other/ci") is None
    assert ring.named("exact/team/gone") is None
    assert ring.named("team/ci") is None
