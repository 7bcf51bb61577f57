"""Client key hashes: the stored form, verification, and refusing malformed hashes."""

from __future__ import annotations

import hashlib
import re

import pytest

from sluicegate.config import generate_key, hash_key, parse_key_hash, verify_key

SALT = bytes(range(16))


def test_hash_form_and_digest() -> None:
    hashed = hash_key("sk-sg-example", SALT)
    digest = hashlib.sha256(SALT + b"sk-sg-example").hexdigest()
    assert hashed == f"sha256:{SALT.hex()}:{digest}"
    assert parse_key_hash(hashed) == (SALT, bytes.fromhex(digest))


def test_round_trip_with_a_fresh_salt() -> None:
    key = generate_key()
    first, second = hash_key(key), hash_key(key)
    assert first != second  # a new salt each time
    assert verify_key(key, first)
    assert verify_key(key, second)
    assert re.fullmatch(r"sha256:[0-9a-f]{32}:[0-9a-f]{64}", first)


def test_wrong_key_does_not_verify() -> None:
    hashed = hash_key("sk-sg-right", SALT)
    assert not verify_key("sk-sg-wrong", hashed)
    assert not verify_key("sk-sg-righ", hashed)
    assert not verify_key("", hashed)


def test_unicode_key_is_hashed_as_utf8() -> None:
    hashed = hash_key("clé-ß", SALT)
    assert hashed.endswith(hashlib.sha256(SALT + "clé-ß".encode()).hexdigest())
    assert verify_key("clé-ß", hashed)


def test_uppercase_hex_is_accepted() -> None:
    hashed = hash_key("sk-sg-example", SALT)
    assert verify_key("sk-sg-example", hashed.upper().replace("SHA256", "sha256"))


def test_generated_keys() -> None:
    keys = {generate_key() for _ in range(50)}
    assert len(keys) == 50
    for key in keys:
        assert re.fullmatch(r"sk-sg-[A-Za-z0-9_-]{32}", key)


def test_empty_key_and_bad_salt_are_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        hash_key("")
    with pytest.raises(ValueError, match="salt has 8 to 64 bytes"):
        hash_key("k", b"short")


GOOD_DIGEST = "0" * 64


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "expected a key hash sha256:<salt hex>:<64 hex digits>"),
        ("md5:00112233445566778899:" + GOOD_DIGEST, "expected a key hash"),
        (f"sha256:{GOOD_DIGEST}", "expected a key hash"),
        (f"sha256:0011223344556677:{GOOD_DIGEST}:extra", "expected a key hash"),
        (f"sha256:001122334455667:{GOOD_DIGEST}", "hex digits in pairs"),
        (f"sha256:00112233445566zz:{GOOD_DIGEST}", "hex digits in pairs"),
        (f"sha256:0011:{GOOD_DIGEST}", "must have 16 to 128 hex digits, got 4"),
        ("sha256:0011223344556677:abc", "digest of a key hash must be 64 hex digits"),
        ("sha256:0011223344556677:" + "g" * 64, "digest of a key hash must be 64 hex digits"),
        ("sk-sg-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", "this looks like an API key, not its hash"),
    ],
)
def test_malformed_hashes(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_key_hash(text)
    with pytest.raises(ValueError):
        verify_key("anything", text)


def test_messages_never_repeat_the_text() -> None:
    secret = "sha256:0011223344556677:not-a-digest-but-maybe-a-secret"
    with pytest.raises(ValueError) as caught:
        parse_key_hash(secret)
    assert "secret" not in str(caught.value)
