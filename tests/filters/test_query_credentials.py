"""The routing stage removes credentials from the query string, and nothing else."""

from __future__ import annotations

import pytest

from sluicegate.filters.request_limits import without_query_credentials


@pytest.mark.parametrize(
    ("path", "sent"),
    [
        (b"/v1/chat?api_key=sk-1", b"/v1/chat"),
        (b"/v1/chat?limit=5&key=sk-1&x=1", b"/v1/chat?limit=5&x=1"),
        (b"/v1/chat?API-Key=sk-1&Access_Token=t", b"/v1/chat"),  # any case, - as _
        (b"/v1/chat?api%5Fkey=sk-1&api+key=x", b"/v1/chat?api+key=x"),  # names decoded
        (b"/v1/chat?q=a%26api_key%3Dsk-1", None),  # a value holding one is a value
        (b"/v1/chat?q=a%20b&flag&z=%E2%82%AC", None),  # kept byte for byte
        (b"/v1/chat?subscription-key=k&sig=s&api-version=1", b"/v1/chat?api-version=1"),
    ],
)  # fmt: skip
def test_only_credential_parameters_are_removed(path: bytes, sent: bytes | None) -> None:
    assert without_query_credentials(path) == sent
