"""The model a run sends when none is given: the first of GET /v1/models."""

from __future__ import annotations

import pytest

from sluicegate.cli import main
from sluicegate.provider import MockProviderSettings, start_mock_provider_thread


def test_an_empty_model_list_is_a_clear_error_not_a_crash(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The mock lists no model unless given --models: an answer of 200 with no ids (and no
    OpenAI error in it) tells the user to give --model. It raised KeyError before."""
    with start_mock_provider_thread(MockProviderSettings(name="bare", ttft_ms=1)) as provider:
        argv = ["--url", provider.url, "--api-key", "k", "--requests", "1", "--concurrency", "1"]
        status = main(["bench", *argv])
    assert status == 1
    err = capsys.readouterr().err
    assert "cannot list the models" in err and "HTTP 200" in err and "give --model" in err
