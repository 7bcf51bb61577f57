"""sluicegate.config: the YAML schema, loading, and problems located by file:line.

Other rooms import from here only:

    config = load_config("routes.yaml")            # Config, or ConfigError(problems)
    keys = resolve_api_keys(config, "routes.yaml")  # provider name -> key or None
    problems = validate_file("routes.yaml")         # for `sluicegate validate`
    hashed = hash_key(key); verify_key(key, hashed)  # client keys (tenants[].keys[].hash)
"""

from .addresses import is_ip_address, split_host_port
from .admin_address import ADMIN_SOCKET_MODE, UNIX_PREFIX, AdminAddress, parse_admin_address
from .admission import (
    LIMIT_KINDS,
    Admission,
    ClientKey,
    Concurrency,
    Limit,
    LimiterStoreConfig,
    LimitKind,
    OnFailure,
    PriorityClass,
    RateLimits,
    StoreKind,
    Tenant,
    check_model_names,
)
from .durations import format_duration_ms, parse_duration_ms
from .keyhash import generate_key, hash_key, parse_key_hash, verify_key
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
)
from .schema import (
    ACCESS_LOG_STDOUT,
    DEFAULT_SCENARIO,
    MAX_SCENARIOS,
    ROUTING_LATENCY,
    AccessLog,
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
    Routing,
    Tls,
    normalize_path_prefix,
)
from .secrets import resolve_api_keys

__all__ = [
    "ACCESS_LOG_STDOUT",
    "ADMIN_SOCKET_MODE",
    "DEFAULT_SCENARIO",
    "LIMIT_KINDS",
    "MAX_SCENARIOS",
    "ROUTING_LATENCY",
    "UNIX_PREFIX",
    "AccessLog",
    "Addresses",
    "AdminAddress",
    "Admission",
    "ApiKeySource",
    "Backend",
    "Backoff",
    "ClientKey",
    "Concurrency",
    "Config",
    "ConfigError",
    "Fault",
    "FaultAbort",
    "FaultDelay",
    "HealthCheck",
    "Http2",
    "Limit",
    "LimitKind",
    "LimiterStoreConfig",
    "Limits",
    "Listener",
    "MockProvider",
    "OnFailure",
    "OutlierDetection",
    "Pool",
    "PriorityClass",
    "Problem",
    "Protocol",
    "Provider",
    "RateLimits",
    "Resilience",
    "Retries",
    "RetryBudget",
    "Route",
    "Routing",
    "Severity",
    "StoreKind",
    "Tenant",
    "Timeouts",
    "Tls",
    "check_model_names",
    "effective",
    "format_duration_ms",
    "generate_key",
    "hash_key",
    "is_ip_address",
    "load_config",
    "load_config_text",
    "normalize_path_prefix",
    "parse_admin_address",
    "parse_duration_ms",
    "parse_key_hash",
    "resolve_api_keys",
    "split_host_port",
    "validate_file",
    "validate_text",
    "verify_key",
]
