"""Mock OpenAI-compatible LLM provider with latency shaping and fault injection.

What the demo, the tests and the benchmarks run against instead of a real provider.
"""

from sluicegate.provider.certs import TestCertificates, make_test_ca
from sluicegate.provider.cli import add_mock_provider_arguments, settings_from_args
from sluicegate.provider.faults import Fault
from sluicegate.provider.server import (
    RunningMockProvider,
    run_mock_provider,
    start_mock_provider,
)
from sluicegate.provider.settings import MockProviderSettings
from sluicegate.provider.thread import ThreadedMockProvider, start_mock_provider_thread

__all__ = [
    "Fault",
    "MockProviderSettings",
    "RunningMockProvider",
    "TestCertificates",
    "ThreadedMockProvider",
    "add_mock_provider_arguments",
    "make_test_ca",
    "run_mock_provider",
    "settings_from_args",
    "start_mock_provider",
    "start_mock_provider_thread",
]
