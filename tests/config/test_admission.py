"""Tenants, client keys, rate limits, priority classes and the limiter store in YAML."""

from __future__ import annotations

import pytest

from sluicegate.config import (
    Admission,
    Limit,
    RateLimits,
    Tenant,
    hash_key,
    load_config_text,
    verify_key,
)

from .helpers import MINIMAL, errors_of, only, problems_of, where

H1 = hash_key("sk-sg-one", bytes(range(16)))
H2 = hash_key("sk-sg-two", bytes(range(1, 17)))
H3 = hash_key("sk-sg-three", bytes(range(2, 18)))

# MINIMAL is 12 lines; everything below starts on line 13.
FULL = (
    MINIMAL.replace(
        "      - provider: alpha\n",
        "      - provider: alpha\n"
        "    rate_limits: {tokens: 100000, per: 1m}\n"  # line 13
        "    default_max_tokens: 512\n"
        "    concurrency:\n"
        "      max_requests: 4\n"
        "      max_tokens: 8000\n"
        "      headroom: 0.5\n",
    )
    + f"""\
admission:
  priority_classes:
    - {{name: interactive, max_queue: 8, max_wait: 2s}}
    - {{name: bulk, max_queue: 0, max_wait: 0}}
  default_priority: bulk
  max_queued: 100
  default_max_tokens: 256
  max_output_tokens: 4096
  store:
    kind: redis
    url: rediss://redis.internal:6380/2
    key_prefix: sg-prod
    timeout: 50ms
    on_failure: fail_closed
    replicas: 4
tenants:
  - name: demo
    priority: interactive
    models: [m]
    rate_limits:
      requests: 60
      tokens: 20000
      input_tokens: 15000
      output_tokens: 5000
      per: 10s
    keys:
      - name: demo-laptop
        hash: "{H1}"
        rate_limits: {{requests: 5, per: 1s}}
      - name: demo-ci
        hash: "{H2}"
  - name: batch-jobs
    keys:
      - {{name: nightly, hash: "{H3}"}}
"""
)


def test_existing_documents_get_the_defaults() -> None:
    config = load_config_text(MINIMAL, "t.yaml")
    admission = config.admission
    assert admission.class_names == ("interactive", "standard", "batch")
    assert [(c.max_queue, c.max_wait) for c in admission.priority_classes] == [
        (64, 10_000),
        (128, 30_000),
        (256, 60_000),
    ]
    assert admission.default_priority == "standard"
    assert admission.max_queued is None
    assert (admission.default_max_tokens, admission.max_output_tokens) == (1024, 1_000_000)
    store = admission.store
    assert (store.kind, store.url, store.key_prefix) == ("memory", None, "sluicegate")
    assert (store.timeout, store.on_failure, store.replicas) == (100, "local", 1)
    assert config.tenants == []
    route = config.routes[0]
    assert (route.rate_limits, route.default_max_tokens, route.concurrency) == (None, None, None)


def test_full_document_is_clean_and_loads_every_field() -> None:
    assert problems_of(FULL) == []
    config = load_config_text(FULL, "t.yaml")
    route = config.routes[0]
    assert route.rate_limits is not None
    assert route.rate_limits.limits() == [Limit("tokens", 100_000, 60_000)]
    assert route.default_max_tokens == 512
    assert route.concurrency is not None
    assert (route.concurrency.max_requests, route.concurrency.max_tokens) == (4, 8000)
    assert route.concurrency.headroom == 0.5
    admission = config.admission
    assert admission.class_names == ("interactive", "bulk")
    assert admission.priority_classes[1].max_wait == 0
    assert (admission.default_priority, admission.max_queued) == ("bulk", 100)
    assert (admission.default_max_tokens, admission.max_output_tokens) == (256, 4096)
    store = admission.store
    assert (store.kind, store.url) == ("redis", "rediss://redis.internal:6380/2")
    assert (store.key_prefix, store.timeout, store.on_failure, store.replicas) == (
        "sg-prod",
        50,
        "fail_closed",
        4,
    )
    demo, batch = config.tenants
    assert (demo.priority, demo.models) == ("interactive", ["m"])
    assert demo.rate_limits is not None
    assert demo.rate_limits.limits() == [
        ("requests", 60, 10_000),
        ("tokens", 20_000, 10_000),
        ("input_tokens", 15_000, 10_000),
        ("output_tokens", 5_000, 10_000),
    ]
    laptop, ci = demo.keys
    assert (laptop.name, ci.name) == ("demo-laptop", "demo-ci")
    assert verify_key("sk-sg-one", laptop.hash)
    assert laptop.rate_limits is not None
    assert laptop.rate_limits.limits() == [Limit("requests", 5, 1000)]
    assert ci.rate_limits is None
    assert (batch.priority, batch.models, batch.rate_limits) == (None, None, None)
    assert admission.priority_of(demo) == "interactive"
    assert admission.priority_of(batch) == "bulk"


def test_rate_limits_helper() -> None:
    assert RateLimits().limits() == []
    assert RateLimits().per == 60_000
    limits = RateLimits.model_validate({"output_tokens": 7, "requests": 3, "per": "1m30s"})
    assert limits.limits() == [("requests", 3, 90_000), ("output_tokens", 7, 90_000)]
    item = limits.limits()[0]
    assert (item.kind, item.limit, item.window_ms) == ("requests", 3, 90_000)


def test_all_null_rate_limits_are_no_limits() -> None:
    text = MINIMAL.replace(
        "    backends:",
        "    rate_limits: {requests: null, tokens: null}\n    backends:",
    )
    assert problems_of(text) == []
    rate_limits = load_config_text(text, "t.yaml").routes[0].rate_limits
    assert rate_limits is not None and rate_limits.limits() == []


def test_models_are_frozen_and_strict() -> None:
    tenant = Tenant(name="x")
    with pytest.raises(ValueError):
        tenant.name = "y"
    with pytest.raises(ValueError):
        Admission.model_validate({"max_queued": "10"})


# --- schema errors (one section at a time) --------------------------------------------


@pytest.mark.parametrize(
    ("snippet", "line", "path", "message"),
    [
        (
            "admission:\n  priority_classes: []\n",
            14,
            "admission.priority_classes",
            "must not be empty",
        ),
        (
            "admission:\n  priority_classes:\n    - {name: Gold, max_queue: 1, max_wait: 1s}\n",
            15,
            "admission.priority_classes[0].name",
            "must be a lowercase name: letters a-z, digits, '.', '_' or '-', starting and "
            "ending with a letter or digit, at most 63 characters; got string 'Gold'",
        ),
        (
            "admission:\n  priority_classes:\n    - {name: x, max_queue: 1, max_wait: 5}\n",
            15,
            "admission.priority_classes[0].max_wait",
            "a duration needs a unit: write 5s or 5ms, not 5",
        ),
        (
            "admission:\n  max_output_tokens: 0\n",
            14,
            "admission.max_output_tokens",
            "must be at least 1, got integer 0",
        ),
        (
            "admission:\n  store:\n    kind: redis\n    url: http://127.0.0.1:6379\n",
            16,
            "admission.store.url",
            "url must start with redis://, rediss:// or unix://",
        ),
        (
            "admission:\n  store:\n    kind: redis\n    url: 'redis://:6379'\n",
            16,
            "admission.store.url",
            "url has no host, e.g. redis://127.0.0.1:6379/0",
        ),
        (
            "admission:\n  store:\n    kind: redis\n    url: 'redis://h:port'\n",
            16,
            "admission.store.url",
            "url has a bad port",
        ),
        (
            "admission:\n  store: {kind: memcached}\n",
            14,
            "admission.store.kind",
            "expected 'memory' or 'redis', got string 'memcached'",
        ),
        (
            "admission:\n  store: {on_failure: open}\n",
            14,
            "admission.store.on_failure",
            "expected 'fail_open', 'fail_closed' or 'local', got string 'open'",
        ),
        (
            "admission:\n  store: {key_prefix: '{x}'}\n",
            14,
            "admission.store.key_prefix",
            "must match the pattern ^[A-Za-z0-9._:-]{1,64}$; got string '{x}'",
        ),
        (
            "admission:\n  store: {replicas: 0}\n",
            14,
            "admission.store.replicas",
            "must be at least 1, got integer 0",
        ),
        (
            "tenants:\n  - name: t\n    models: []\n    keys: []\n",
            15,
            "tenants[0].models",
            "must not be empty",
        ),
        (
            "tenants:\n  - name: t\n    rate_limit: {requests: 1}\n",
            15,
            "tenants[0].rate_limit",
            "unknown key 'rate_limit' (allowed: name, priority, models, rate_limits, keys, lane); "
            "did you mean 'rate_limits'?",
        ),
        (
            "tenants:\n  - name: t\n    rate_limits: {tokens: 0}\n",
            15,
            "tenants[0].rate_limits.tokens",
            "must be at least 1, got integer 0",
        ),
        (
            "tenants:\n  - name: t\n    rate_limits: {requests: 5, per: 60}\n",
            15,
            "tenants[0].rate_limits.per",
            "a duration needs a unit: write 60s or 60ms, not 60",
        ),
        (
            "tenants:\n  - name: t\n    keys:\n      - {name: k, hash: 'sha256:00:11'}\n",
            16,
            "tenants[0].keys[0].hash",
            "the salt of a key hash must have 16 to 128 hex digits, got 2",
        ),
        (
            "tenants:\n  - name: t\n    keys:\n      - {name: k, hash: 'sk-sg-AAAA'}\n",
            16,
            "tenants[0].keys[0].hash",
            "this looks like an API key, not its hash: never write a key in the config; "
            "run `sluicegate hash-key` and paste the hash it prints",
        ),
        (
            "tenants:\n  - name: t\n    keys:\n      - {name: k}\n",
            16,
            "tenants[0].keys[0].hash",
            "missing required key 'hash'",
        ),
    ],
)
def test_schema_errors_name_line_and_key(snippet: str, line: int, path: str, message: str) -> None:
    problem = only(errors_of(MINIMAL + snippet))
    assert (problem.line, problem.key_path, problem.message) == (line, path, message)


@pytest.mark.parametrize(
    ("concurrency", "path", "message"),
    [
        ("{headroom: 0.1}", "routes[0].concurrency", "give max_requests, max_tokens or both"),
        ("{max_requests: 0}", "routes[0].concurrency.max_requests", "must be at least 1"),
        ("{max_tokens: 4, headroom: 1}", "routes[0].concurrency.headroom", "must be less than 1"),
        ("{max_tokens: 4, headroom: -0.1}", "routes[0].concurrency.headroom", "must be at least"),
    ],
)
def test_concurrency_errors(concurrency: str, path: str, message: str) -> None:
    text = MINIMAL.replace("    backends:", f"    concurrency: {concurrency}\n    backends:")
    problem = only(errors_of(text))
    assert (problem.line, problem.key_path) == (11, path)
    assert problem.message.startswith(message)


def test_redis_urls_that_are_accepted() -> None:
    for url in (
        "redis://127.0.0.1:6379/0",
        "rediss://:secret@r.example:6380",
        "unix:///run/r.sock",
    ):
        text = MINIMAL + f"admission:\n  store: {{kind: redis, url: '{url}'}}\n"
        assert problems_of(text) == [], url


def test_url_messages_never_echo_the_url() -> None:
    text = MINIMAL + "admission:\n  store: {kind: redis, url: 'http://:hunter2@r:1'}\n"
    assert "hunter2" not in str(only(problems_of(text)))


# --- rules across the document ----------------------------------------------------------


def test_redis_store_needs_a_url() -> None:
    problem = only(problems_of(MINIMAL + "admission:\n  store:\n    kind: redis\n"))
    assert (problem.line, problem.key_path, problem.message) == (
        15,
        "admission.store.kind",
        "a redis store needs a url, e.g. url: redis://127.0.0.1:6379/0",
    )


def test_memory_store_refuses_a_url() -> None:
    problem = only(problems_of(MINIMAL + "admission:\n  store:\n    url: redis://r:6379\n"))
    assert (problem.line, problem.key_path, problem.message) == (
        15,
        "admission.store.url",
        "url is used only by a redis store: set kind: redis or remove the url",
    )


CLASSES = """\
admission:
  priority_classes:
    - {name: gold, max_queue: 1, max_wait: 1s}
    - {name: silver, max_queue: 1, max_wait: 1s}
"""


def test_duplicate_class_names() -> None:
    text = MINIMAL + CLASSES + "    - {name: gold, max_queue: 2, max_wait: 2s}\n"
    text += "  default_priority: silver\n"
    problem = only(problems_of(text))
    assert (problem.line, problem.key_path, problem.message) == (
        17,
        "admission.priority_classes[2].name",
        "duplicate priority class name 'gold' (first at admission.priority_classes[0].name, "
        "line 15)",
    )


def test_default_priority_must_be_declared() -> None:
    problem = only(problems_of(MINIMAL + CLASSES + "  default_priority: silvr\n"))
    assert (problem.line, problem.key_path, problem.message) == (
        17,
        "admission.default_priority",
        "unknown priority class 'silvr' (known: gold, silver); did you mean 'silver'?",
    )


def test_default_priority_left_at_standard_with_other_classes() -> None:
    problem = only(problems_of(MINIMAL + CLASSES))
    assert (problem.line, problem.key_path) == (13, "admission.default_priority")
    assert problem.message == (
        "unknown priority class 'standard' (known: gold, silver); "
        "set admission.default_priority to one of the declared classes"
    )


def tenant(body: str) -> str:
    """MINIMAL plus one tenant named t (lines 13-14) with one key (15-16), then `body`."""
    return MINIMAL + f'tenants:\n  - name: t\n    keys:\n      - {{name: k, hash: "{H1}"}}\n' + body


def test_tenant_priority_must_be_declared() -> None:
    problem = only(problems_of(tenant("    priority: interactiv\n")))
    assert (problem.line, problem.key_path, problem.message) == (
        17,
        "tenants[0].priority",
        "unknown priority class 'interactiv' (known: interactive, standard, batch); "
        "did you mean 'interactive'?",
    )


def test_tenant_model_must_be_served() -> None:
    text = tenant("    models: [m, gpt-4o]\n").replace("models: [m]", "models: [m, gpt-4o-mini]")
    problem = only(problems_of(text))
    assert (problem.line, problem.key_path, problem.message) == (
        17,
        "tenants[0].models[1]",
        "tenant 't' may use model 'gpt-4o', which no route serves (served: m, gpt-4o-mini); "
        "did you mean 'gpt-4o-mini'?",
    )


def test_tenant_models_are_not_checked_while_a_route_is_broken() -> None:
    text = tenant("    models: [gone]\n").replace("- name: chat\n", "- name: chat\n    bogus: 1\n")
    assert where(errors_of(text)) == [(10, "routes[0].bogus")]
    assert where(errors_of(text.replace("    bogus: 1\n", ""))) == [(17, "tenants[0].models[0]")]


def test_duplicate_tenant_names() -> None:
    text = tenant(f'  - name: t\n    keys: [{{name: k2, hash: "{H2}"}}]\n')
    problem = only(problems_of(text))
    assert (problem.line, problem.key_path, problem.message) == (
        17,
        "tenants[1].name",
        "duplicate tenant name 't' (first at tenants[0].name, line 14)",
    )


def test_key_names_are_unique_across_tenants() -> None:
    text = tenant(f'  - name: u\n    keys:\n      - {{name: k, hash: "{H2}"}}\n')
    problem = only(problems_of(text))
    assert (problem.line, problem.key_path, problem.message) == (
        19,
        "tenants[1].keys[0].name",
        "duplicate key name 'k' (first at tenants[0].keys[0].name, line 16); key names are "
        "unique across all tenants",
    )


def test_the_same_hash_twice() -> None:
    text = tenant(f'      - {{name: k2, hash: "{H1.upper().replace("SHA256", "sha256")}"}}\n')
    problem = only(problems_of(text))
    assert (problem.line, problem.key_path) == (17, "tenants[0].keys[1].hash")
    assert problem.message.startswith(
        "key 'k2' has the same hash as key 'k' of tenant 't' (at tenants[0].keys[0].hash, "
        "line 16); one API key belongs to one key entry"
    )


def test_keys_of_a_broken_tenant_are_still_checked() -> None:
    # Tenant u fails validation (bad priority type), yet its key k is a duplicate.
    text = tenant(f'  - name: u\n    priority: 3\n    keys:\n      - {{name: k, hash: "{H2}"}}\n')
    assert where(problems_of(text)) == [
        (18, "tenants[1].priority"),
        (20, "tenants[1].keys[0].name"),
    ]


def test_tenant_without_keys_is_a_warning() -> None:
    text = tenant("  - name: empty\n")
    problem = only(problems_of(text))
    assert (problem.line, problem.key_path, problem.severity) == (17, "tenants[1].name", "warning")
    assert problem.message == "tenant 'empty' has no keys, so no request can reach it"
    assert [t.name for t in load_config_text(text, "t.yaml").tenants] == ["t", "empty"]


def test_token_estimate_above_the_output_cap() -> None:
    text = MINIMAL.replace("    backends:", "    default_max_tokens: 9000\n    backends:")
    text += "admission:\n  default_max_tokens: 5000\n  max_output_tokens: 4000\n"
    problems = problems_of(text)
    assert where(problems) == [
        (11, "routes[0].default_max_tokens"),
        (15, "admission.default_max_tokens"),
    ]
    assert [p.message for p in problems] == [
        "route 'chat': default_max_tokens (9000) is larger than admission.max_output_tokens (4000)",
        "default_max_tokens (5000) is larger than max_output_tokens (4000)",
    ]


def test_every_problem_of_a_file_at_once() -> None:
    text = tenant(
        "    priority: nope\n"
        "    models: [nope]\n"
        f'  - name: t\n    keys: [{{name: k, hash: "{H1}"}}]\n'
    )
    text += "admission:\n  store: {kind: redis}\n"
    assert [(p.line, p.key_path) for p in problems_of(text)] == [
        (17, "tenants[0].priority"),
        (18, "tenants[0].models[0]"),
        (19, "tenants[1].name"),
        (20, "tenants[1].keys[0].name"),
        (20, "tenants[1].keys[0].hash"),
        (22, "admission.store.kind"),
    ]


def test_a_gate_that_replicas_cannot_share_evenly_is_warned_about() -> None:
    gated = FULL.replace("replicas: 4", "replicas: 3")
    problems = problems_of(gated)
    assert [(p.key_path, p.severity) for p in problems] == [
        ("routes[0].concurrency.max_requests", "warning"),
        ("routes[0].concurrency.max_tokens", "warning"),
    ]
    assert "3 ext_proc replicas each allow 1 (4 ÷ 3, rounded down): 3 in all" in (
        problems[0].message
    )
    assert problems_of(FULL.replace("replicas: 4", "replicas: 8")) != []
    assert "at least 1" in problems_of(FULL.replace("replicas: 4", "replicas: 8"))[0].message
    assert problems_of(FULL.replace("replicas: 4", "replicas: 2")) == []


def test_memory_store_with_replicas_and_limits_is_warned_about() -> None:
    limited = MINIMAL + "    rate_limits: {requests: 100, per: 1m}\n"
    replicas = "version: 1\nsluicegate: {ext_proc_replicas: [127.0.0.1:18101]}\n"
    with_replica = limited.replace("version: 1\n", replicas)
    [problem] = problems_of(with_replica)
    assert (problem.key_path, problem.severity, problem.line) == (
        "sluicegate.ext_proc_replicas",
        "warning",
        2,
    )
    assert "2 ext_proc processes" in problem.message and "up to 2x every limit" in problem.message
    # Counted elsewhere: store.replicas says so.
    [problem] = problems_of(limited + "admission: {store: {replicas: 3}}\n")
    assert problem.key_path == "admission.store.replicas" and "3x" in problem.message
    # Shared in Redis, or no limit to share, or one process: nothing to say.
    redis = "admission: {store: {kind: redis, url: 'redis://127.0.0.1:6379/0'}}\n"
    assert problems_of(with_replica + redis) == []
    assert problems_of(MINIMAL.replace("version: 1\n", replicas)) == []
    assert problems_of(limited) == []
