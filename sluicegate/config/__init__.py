"""sluicegate.config: the YAML schema, loading, and problems located by file:line.

Other rooms import from here only:

    config = load_config("routes.yaml")            # Config, or ConfigError(problems)
    keys = resolve_api_keys(config, "routes.yaml")  # provider name -> key or None
    problems = validate_file("routes.yaml")         # for `sluicegate validate`
"""

from .addresses import is_ip_address, split_host_port
from .drain import drained_view
from .loader import load_config, load_config_text, validate_file, validate_text
from .problems import ConfigError, Problem, Severity
from .resilience import (
    Backoff,
    HealthCheck,
    Http2,
    OutlierDetection,
    Pool,
    Protocol,
    Resilience,
    Retries,
    RetryBudget,
    Timeouts,
    effective,
    format_duration_ms,
    parse_duration_ms,
)
from .schema import (
    Addresses,
    ApiKeySource,
    Backend,
    Config,
    Fault,
    FaultAbort,
    FaultDelay,
    Limits,
    Listener,
    MockProvider,
    Provider,
    Route,
    Tls,
)
from .secrets import resolve_api_keys

__all__ = [
    "Addresses",
    "ApiKeySource",
    "Backend",
    "Backoff",
    "Config",
    "ConfigError",
    "Fault",
    "FaultAbort",
    "FaultDelay",
    "HealthCheck",
    "Http2",
    "Limits",
    "Listener",
    "MockProvider",
    "OutlierDetection",
    "Pool",
    "Problem",
    "Protocol",
    "Provider",
    "Resilience",
    "Retries",
    "RetryBudget",
    "Route",
    "Severity",
    "Timeouts",
    "Tls",
    "drained_view",
    "effective",
    "format_duration_ms",
    "is_ip_address",
    "load_config",
    "load_config_text",
    "parse_duration_ms",
    "resolve_api_keys",
    "split_host_port",
    "validate_file",
    "validate_text",
]
