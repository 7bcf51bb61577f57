"""Client API keys as the config stores them: `sha256:<salt hex>:<digest hex>`.

The config never holds a client's key, only a salted SHA-256 of it, so a leaked
config (or `git log`) does not leak keys. A fast hash is the right cost here: keys
made by `generate_key` carry 192 random bits, far beyond any brute force, so a slow
password KDF (bcrypt, scrypt, argon2) would add nothing but milliseconds to every
request. The per-key random salt keeps two configs holding the same key from
showing it, and keeps precomputed tables useless.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

SCHEME = "sha256"
KEY_PREFIX = "sk-sg-"
SALT_BYTES = 16  # what hash_key makes
_MIN_SALT_BYTES, _MAX_SALT_BYTES = 8, 64  # what a config may carry
_DIGEST_HEX = 64
_HEX = re.compile(r"[0-9a-fA-F]*")
FORM = "sha256:<salt hex>:<64 hex digits>"


def generate_key() -> str:
    """A new client key: `sk-sg-` and 32 URL-safe characters (192 random bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(24)


def hash_key(key: str, salt: bytes | None = None) -> str:
    """`sha256:<salt hex>:<hex of sha256(salt + key as UTF-8)>`, with a fresh 16-byte salt
    unless one is given (tests)."""
    if not key:
        raise ValueError("the key is empty")
    if salt is None:
        salt = secrets.token_bytes(SALT_BYTES)
    elif not _MIN_SALT_BYTES <= len(salt) <= _MAX_SALT_BYTES:
        raise ValueError(f"a salt has {_MIN_SALT_BYTES} to {_MAX_SALT_BYTES} bytes")
    return f"{SCHEME}:{salt.hex()}:{_digest(salt, key).hex()}"


def verify_key(key: str, hashed: str) -> bool:
    """Whether `key` is the key behind `hashed` (constant-time comparison).

    Raises ValueError when `hashed` is not in the `sha256:<salt>:<digest>` form; a
    validated config never holds such a hash.
    """
    salt, digest = parse_key_hash(hashed)
    return hmac.compare_digest(_digest(salt, key), digest)


def parse_key_hash(text: str) -> tuple[bytes, bytes]:
    """(salt, digest) of a stored hash; ValueError saying what is wrong otherwise.

    Messages never repeat `text`: someone may have pasted the key itself here.
    """
    if text.startswith(KEY_PREFIX) or text.startswith("sk-"):
        raise ValueError(
            "this looks like an API key, not its hash: never write a key in the config; "
            "run `sluicegate hash-key` and paste the hash it prints"
        )
    parts = text.split(":")
    if len(parts) != 3 or parts[0] != SCHEME:
        raise ValueError(f"expected a key hash {FORM}, as printed by `sluicegate hash-key`")
    salt_hex, digest_hex = parts[1], parts[2]
    if not _HEX.fullmatch(salt_hex) or len(salt_hex) % 2:
        raise ValueError(f"the salt of a key hash must be hex digits in pairs ({FORM})")
    if not _MIN_SALT_BYTES * 2 <= len(salt_hex) <= _MAX_SALT_BYTES * 2:
        raise ValueError(
            f"the salt of a key hash must have {_MIN_SALT_BYTES * 2} to {_MAX_SALT_BYTES * 2} "
            f"hex digits, got {len(salt_hex)}"
        )
    if not _HEX.fullmatch(digest_hex) or len(digest_hex) != _DIGEST_HEX:
        raise ValueError(
            f"the digest of a key hash must be {_DIGEST_HEX} hex digits (SHA-256), "
            f"got {len(digest_hex)} characters"
        )
    return bytes.fromhex(salt_hex), bytes.fromhex(digest_hex)


def _digest(salt: bytes, key: str) -> bytes:
    return hashlib.sha256(salt + key.encode("utf-8")).digest()
