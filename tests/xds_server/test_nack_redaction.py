"""A NACK's message keeps no key: Envoy quotes the rejected configuration as text, which
ignores the `sensitive` annotation, and cuts the message at 4 KB, maybe inside a key."""

from __future__ import annotations

import pytest

from sluicegate.xds.server.stream import without_secrets


@pytest.mark.parametrize(
    "message",
    [
        'Proto constraint validation failed: credentials { key: "sk-sg-LEAK" client: "c" }',
        'generic_secret { secret { inline_string: "sk-sg-LEAK" } }',
        '{"credentials": [{"key": "sk-sg-LEAK", "client": "c"}]}',
        # Cut off by Envoy inside the value: no closing quote.
        'credentials { key: "sk-sg-LEAK...(truncated)',
        'key: "sk-sg-\\"LEAK" next',
    ],
)
def test_a_quoted_key_is_redacted(message: str) -> None:
    redacted = without_secrets(message)
    assert "LEAK" not in redacted
    assert "[redacted]" in redacted


def test_other_text_stays() -> None:
    message = 'cluster bad: invalid lb_policy; descriptor_key: "tenant" monkey: "x"'
    assert without_secrets(message) == message
