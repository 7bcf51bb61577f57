"""Config fixtures for the golden-file tests, written as a user would write them.

Each case: (YAML document, resolved API keys by provider name). Keys are fake.
"""

from __future__ import annotations

from typing import Any

import yaml

from sluicegate.config.schema import Config
from sluicegate.xds.translate import GatewayIR, build_ir

CASES: dict[str, tuple[str, dict[str, str | None]]] = {
    # The smallest useful gateway: one plain-HTTP provider with a key.
    "single_provider": (
        """
version: 1
listeners:
  - {name: main, port: 8080}
providers:
  - name: local
    base_url: http://127.0.0.1:8001/v1
    api_key: {env: LOCAL_KEY}
routes:
  - name: chat
    models: [gpt-4o-mini]
    backends: [{provider: local}]
""",
        {"local": "sk-local-test"},
    ),
    # Two providers sharing a model 3:1, each with its own key.
    "weighted_keys": (
        """
version: 1
listeners:
  - {name: main, port: 8080}
providers:
  - name: alpha
    base_url: http://10.0.0.1:8000/v1/
    api_key: {env: ALPHA_KEY}
  - name: beta
    base_url: http://10.0.0.2/v1
    api_key: {file: beta.key}
routes:
  - name: chat
    models: [gpt-4o, gpt-4o-mini]
    backends:
      - {provider: alpha, weight: 3}
      - {provider: beta, weight: 1}
""",
        {"alpha": "sk-alpha-test", "beta": "sk-beta-test\n"},
    ),
    # A primary and a fallback; priorities 0 and 5 become levels 0 and 1. Sidecar role.
    "priority_fallback": (
        """
version: 1
limits: {max_request_body_bytes: 1048576, ext_proc_message_timeout_ms: 2000}
listeners:
  - {name: app, address: 127.0.0.1, port: 15001, role: sidecar}
providers:
  - name: primary
    base_url: http://10.0.0.1:8000/v1
    api_key: {env: PRIMARY_KEY}
  - name: spare
    base_url: http://10.0.0.9:8000/v1
    api_key: {env: SPARE_KEY}
routes:
  - name: chat
    models: [llama-3-70b]
    backends:
      - {provider: spare, priority: 5}
      - {provider: primary, priority: 0}
""",
        {"primary": "sk-primary-test", "spare": "sk-spare-test"},
    ),
    # Host names (DNS cluster) over TLS: SNI override with a private CA, and a skip-verify.
    "dns_tls": (
        """
version: 1
listeners:
  - {name: edge, address: 0.0.0.0, port: 8443}
providers:
  - name: openai
    base_url: https://api.openai.com/v1
    api_key: {env: OPENAI_API_KEY}
  - name: private
    base_url: https://llm.internal.example:9443/v1
    api_key: {env: PRIVATE_KEY}
    tls: {sni: gateway.internal.example, ca_file: /etc/sluicegate/private-ca.pem}
  - name: lab
    base_url: https://192.0.2.10/v1
    tls: {insecure_skip_verify: true}
routes:
  - name: chat
    models: [gpt-4o]
    backends:
      - {provider: openai}
      - {provider: private, priority: 1}
  - name: lab
    models: [lab-model]
    backends: [{provider: lab}]
""",
        {"openai": "sk-openai-test", "private": "sk-private-test", "lab": None},
    ),
    # Per-provider model names and URL prefixes: the attempt-stage ext_proc is needed.
    "rewrite": (
        """
version: 1
listeners:
  - {name: main, port: 8080}
  - {name: second, port: 8081}
providers:
  - name: openai-like
    base_url: http://10.0.0.1:8000/v1
    api_key: {env: A_KEY}
  - name: zhipu
    base_url: http://10.0.0.2:8000/api/paas/v4/
    api_key: {env: Z_KEY}
    model_map: {chat-default: glm-4, unrelated: other}
  - name: bare
    base_url: http://10.0.0.3:9000
routes:
  - name: mixed
    models: [chat-default]
    backends:
      - {provider: openai-like}
      - {provider: zhipu}
  - name: renamed
    path_prefix: /openai
    models: [chat-default, glm-4]
    backends: [{provider: zhipu}]
  - name: bare
    models: [tiny]
    backends: [{provider: bare}]
""",
        {"openai-like": "sk-a-test", "zhipu": "sk-z-test"},
    ),
    # Providers without keys: the client's Authorization is still removed upstream.
    "no_key": (
        """
version: 1
listeners:
  - {name: main, port: 8080}
providers:
  - name: ollama
    base_url: http://127.0.0.1:11434/v1
  - name: vllm
    base_url: http://localhost:8000/v1
routes:
  - name: local
    models: [llama3]
    backends:
      - {provider: ollama}
      - {provider: vllm}
""",
        {},
    ),
    # Resilience: defaults changed at the top, overridden per route; an HTTP/2 provider
    # over TLS (ALPN h2); per-provider connection limit; active health checks for one
    # provider of a route (the other opts out); retries and outlier detection off.
    "resilience": (
        """
version: 1
defaults:
  pool:
    max_connections: 200
    max_pending_requests: 50
    max_requests: 300
    max_connections_per_provider: 64
    idle_timeout: 30s
    max_requests_per_connection: 1000
  timeouts: {connect: 1s, first_byte: 20s, idle: 30s, total: 5m}
  retries:
    max_retries: 3
    retry_on: [connect-failure, reset, 429, 503]
    backoff: {base: 250ms, max: 4s}
    retry_after_max: 30s
    budget: {percent: 25.5, min_concurrency: 5}
  outlier_detection:
    consecutive_5xx: 0
    consecutive_gateway_failure: 2
    interval: 2s
    base_ejection_time: 10s
    max_ejection_time: 1m
    max_ejection_percent: 100
listeners:
  - {name: main, port: 8080}
providers:
  - name: fast
    base_url: https://fast.example/v1
    api_key: {env: FAST_KEY}
    protocol: http2
  - name: primary
    base_url: http://10.0.0.1:8000/v1
    api_key: {env: PRIMARY_KEY}
    health_check:
      {interval: 3s, timeout: 1s, unhealthy_threshold: 3, expected_statuses: [200, "401-404"]}
  - name: backup
    base_url: http://10.0.0.2:8000/v1
routes:
  - name: h2
    models: [fast-model]
    pool: {http2: {max_concurrent_streams: 50, keepalive_interval: 20s, keepalive_timeout: 2s}}
    backends: [{provider: fast}]
  - name: checked
    models: [big-model]
    timeouts: {first_byte: 0, idle: 45s, total: 0}
    retries: {backoff: {base: 1s}, other_provider: true}
    backends:
      - {provider: primary}
      - {provider: backup, priority: 1}
  - name: plain
    models: [small-model]
    timeouts: {first_byte: 0, idle: 0}
    retries: {max_retries: 0}
    outlier_detection: {enabled: false}
    pool: {max_connections_per_provider: 0, idle_timeout: 0}
    backends: [{provider: backup}]
""",
        {"fast": "sk-fast-test", "primary": "sk-primary-test", "backup": None},
    ),
    # Admission: tenants, token limits (so the usage observer runs), a priority gate
    # (so the routing stage waits longer than the longest queue wait).
    "admission": (
        """
version: 1
admission:
  priority_classes:
    - {name: interactive, max_queue: 8, max_wait: 10s}
    - {name: batch, max_queue: 64, max_wait: 45s}
  default_priority: batch
listeners:
  - {name: main, port: 8080}
providers:
  - name: local
    base_url: http://127.0.0.1:8001/v1
routes:
  - name: chat
    models: [gpt-4o-mini]
    backends: [{provider: local}]
    rate_limits: {tokens: 200000}
    concurrency: {max_requests: 16, headroom: 0.25}
tenants:
  - name: team
    priority: interactive
    rate_limits: {requests: 600, tokens: 100000, per: 1m}
    keys:
      - name: team-key
        hash: "sha256:00112233445566778899aabbccddeeff:""" + "0" * 64 + """"
""",
        {"local": None},
    ),
}


def config_of(document: str) -> Config:
    data: dict[str, Any] = yaml.safe_load(document)
    return Config.model_validate(data)


def ir_of(case: str) -> GatewayIR:
    document, keys = CASES[case]
    return build_ir(config_of(document), keys)
