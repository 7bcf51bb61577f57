"""What a provider receives: an allowlist of the client's request headers, its own fixed
headers (docs/architecture.md, "What a provider receives"). Credentials in the query
string are removed earlier, by the routing stage (filters/request_limits.py) or, for a
request Envoy decides alone, the model reader (model_reader.py).

The last upstream filter of a route's cluster (clusters.py), run on every attempt after
the credential injector set the provider's key:
1. removes every request header that is neither a pseudo-header nor on the provider's
   allowlist (CLIENT_HEADERS; the provider's `forward_headers`, names or `prefix*`, with
   `x-mock-*` for a mock, model/providers.py; KEPT: what sluicegate itself put there).
   So a client's Cookie, x-goog-api-key or OpenAI-Organization, its
   X-Forwarded-For, and internal headers such as x-sluicegate-provider (which the
   credential injector matched on) and x-envoy-* never leave the gateway;
2. removes the fixed headers the route's other providers set and this one does not
   (withheld_headers: a retry would otherwise carry the first provider's values);
3. sets the provider's fixed `headers` (replacing a client's value).

Envoy's header_mutation removes headers by a name matcher only, so "not on the list" is
written as a union of regular expressions (RE2, matched against the whole lower-case
name). Envoy refuses a regex whose compiled RE2 program is larger than 100 (runtime
`re2.max_program_size.error_level`), and the complement of even the default list
compiles to several hundred, so `removal_regexes` splits it along a trie of the names
into pieces whose estimated size stays under a budget (tests/translate hold the estimate
to Envoy). A route whose providers all receive the same gets one header_mutation;
otherwise a composite matched on x-sluicegate-provider runs each provider's own.

An Envoy that loads sluicegate's native library gets the library's filter instead, from
the same lists (native_forwarded_headers_config; docs/native-filters.md, "The header
allowlist").
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from envoy.config.common.mutation_rules.v3 import mutation_rules_pb2
from envoy.config.core.v3 import base_pb2, extension_pb2
from envoy.extensions.filters.http.header_mutation.v3 import header_mutation_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.type.matcher.v3 import regex_pb2, string_pb2

from sluicegate import wire
from sluicegate.model import Provider, Route

from ._proto import execute_filter, pack, per_provider_filter
from .native import native_forwarded_headers

# Stats appear as cluster.<name>.… under this name.
FORWARDED_HEADERS_FILTER = "sluicegate.forwarded_headers"
HEADER_MUTATION_FILTER = "envoy.filters.http.header_mutation"

# The client's request headers every provider receives: what an OpenAI-compatible API
# reads (content negotiation, the SDK's beta opt-ins) and what traces a request across
# hops (W3C trace context, Envoy's request id). Not Accept-Encoding: the usage of a
# compressed answer could not be read.
CLIENT_HEADERS: Final = (
    "accept",
    "content-type",
    "openai-beta",
    "traceparent",
    "tracestate",
    "user-agent",
    "x-request-id",
)
# Kept because sluicegate or Envoy set them before this filter: the provider's key (the
# credential injector; the client's own was removed by the first upstream filter) and
# the body's length (the attempt stage sets it when it rewrites the body).
KEPT: Final = ("authorization", "content-length")
# What an attempt whose provider is unknown receives (route_receives).
BUILT_IN: Final = tuple(sorted({*CLIENT_HEADERS, *KEPT}))
# Estimated RE2 program size a piece may reach (Envoy refuses above 100).
SIZE_BUDGET: Final = 90


def allowed_headers(provider: Provider) -> tuple[str, ...]:
    """The request headers that reach `provider` as they are, pseudo-headers aside, sorted
    (its fixed `headers` are set after the others are removed)."""
    return tuple(sorted({*CLIENT_HEADERS, *KEPT, *provider.forward_headers}))


@dataclass(frozen=True, slots=True)
class Receives:
    """What an attempt's provider receives: the client's headers `allowed` (names or
    `prefix*`) but not those `withheld`, then its `fixed` headers."""

    allowed: tuple[str, ...]
    withheld: tuple[str, ...]
    fixed: tuple[tuple[str, str], ...]


def route_receives(route: Route) -> tuple[Receives, dict[str, Receives]]:
    """What each provider of `route` receives: (for a provider no entry names, by provider
    name). A route whose providers all receive the same has no entries: the first applies
    to every attempt. Otherwise the first is the built-in list (an attempt the first
    upstream filter named no provider for, never while it names one on every attempt: a
    safeguard, never forward all) and each provider has its own. Both filters are
    written from this (forwarded_headers_filter, native_forwarded_headers_config)."""
    providers = sorted({b.provider.name: b.provider for b in route.backends}.values(),
                       key=lambda p: p.name)  # fmt: skip
    if len({(p.forward_headers, p.headers) for p in providers}) == 1:
        return Receives(allowed_headers(providers[0]), (), providers[0].headers), {}
    anyone = Receives(BUILT_IN, withheld_headers(None, providers), ())
    return anyone, {
        p.name: Receives(allowed_headers(p), withheld_headers(p, providers), p.headers)
        for p in providers
    }


def forwarded_headers_filter(route: Route, native_module: str | None = None) -> hcm_pb2.HttpFilter:
    """The upstream filter giving each attempt's provider what it may receive: with a
    `native_module`, the library's (native_forwarded_headers_config), else header_mutation.

    Must follow the credentials filter (secrets.py): it keeps the Authorization that
    filter set and removes the provider header that filter matched on.
    """
    if native_module is not None:
        return native_forwarded_headers(
            FORWARDED_HEADERS_FILTER, native_module, native_forwarded_headers_config(route)
        )
    anyone, each = route_receives(route)
    if not each:
        return hcm_pb2.HttpFilter(
            name=FORWARDED_HEADERS_FILTER, typed_config=pack(_mutation(anyone))
        )
    runs = {
        name: (f"forward-{name}", _mutation_filter(_mutation(receives)))
        for name, receives in each.items()
    }
    default = _mutation_filter(_mutation(anyone))
    return per_provider_filter(
        FORWARDED_HEADERS_FILTER, runs, execute_filter("forward-default", default)
    )


def native_forwarded_headers_config(route: Route) -> str:
    """The native filter's configuration (c/forwarded_headers.c): route_receives as
    `key=value` lines, the lines before any `provider=` for a provider no block names."""
    anyone, each = route_receives(route)
    lines = [f"provider_header={wire.PROVIDER_HEADER}", *_native_block(anyone)]
    for name, receives in each.items():
        lines += [f"provider={name}", *_native_block(receives)]
    return "".join(line + "\n" for line in lines)


def withheld_headers(provider: Provider | None, providers: Iterable[Provider]) -> tuple[str, ...]:
    """The fixed headers of a route's `providers` that `provider` (None: a provider the
    route does not know) does not set itself, sorted: removed on its attempts even when
    its list names them. Envoy's upstream filters change the one request every attempt
    starts from, so a retry on it would otherwise carry the first provider's values (its
    OpenAI-Organization to another account's key)."""
    own = {name for name, _ in provider.headers} if provider is not None else set()
    return tuple(sorted({name for p in providers for name, _ in p.headers} - own))


def _native_block(receives: Receives) -> list[str]:
    return ([f"allow={name}" for name in receives.allowed]
            + [f"withhold={name}" for name in receives.withheld]
            + [f"set={name}:{value}" for name, value in receives.fixed])  # fmt: skip


def _mutation_filter(
    mutation: header_mutation_pb2.HeaderMutation,
) -> extension_pb2.TypedExtensionConfig:
    return extension_pb2.TypedExtensionConfig(
        name=HEADER_MUTATION_FILTER, typed_config=pack(mutation)
    )


def _mutation(receives: Receives) -> header_mutation_pb2.HeaderMutation:
    """Remove what is not allowed and what is withheld, then set the fixed headers."""
    mutations = [
        mutation_rules_pb2.HeaderMutation(
            remove_on_match=mutation_rules_pb2.HeaderMutation.RemoveOnMatch(key_matcher=matcher)
        )
        for matcher in removal_matchers(receives.allowed)
    ]
    mutations += [mutation_rules_pb2.HeaderMutation(remove=name) for name in receives.withheld]
    for name, value in receives.fixed:
        mutations.append(
            mutation_rules_pb2.HeaderMutation(
                append=base_pb2.HeaderValueOption(
                    header=base_pb2.HeaderValue(key=name, value=value),
                    append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
                )
            )
        )
    return header_mutation_pb2.HeaderMutation(
        mutations=header_mutation_pb2.Mutations(request_mutations=mutations)
    )


# ----- "any name but these" as RE2 pieces under Envoy's program-size limit ---------------


@dataclass(frozen=True, slots=True)
class Piece:
    """A regular expression over whole header names, with its estimated share of an RE2
    program (without the program's own _BASE)."""

    regex: str
    size: int


def removal_matchers(allowed: Iterable[str]) -> list[string_pb2.StringMatcher]:
    """StringMatchers whose union is every header name except `allowed` and pseudo-headers."""
    return [
        string_pb2.StringMatcher(safe_regex=regex_pb2.RegexMatcher(regex=regex))
        for regex in removal_regexes(allowed)
    ]


def removal_regexes(allowed: Iterable[str]) -> list[str]:
    """The regexes of `removal_matchers`: pieces packed into alternations under the budget."""
    return list(_removal_regexes(tuple(sorted(set(allowed)))))


# A few distinct lists serve every cluster (most providers share the default): building one
# costs ~0.5 ms (RESULTS.md, "xDS push: before and after…"), so each is built once per
# process, not once per route and reload.
@functools.lru_cache(maxsize=256)
def _removal_regexes(allowed: tuple[str, ...]) -> tuple[str, ...]:
    pieces = _pieces(_trie(allowed))
    packed: list[Piece] = []
    for piece in pieces:
        if packed and _BASE + packed[-1].size + piece.size <= SIZE_BUDGET:
            last = packed[-1]
            packed[-1] = Piece(f"{last.regex}|{piece.regex}", last.size + piece.size)
        else:
            packed.append(piece)
    return tuple(piece.regex for piece in packed)


# Trie keys besides single characters: the path so far is an allowed name; every name
# that starts with the path so far is allowed (a `prefix*` entry).
_END, _ALL = "<end>", "<all>"
_Trie = dict[str, "_Trie"]

# Estimated RE2 instructions, fitted on the sizes Envoy 1.40 reports, rounded up: a
# literal character 1, a "[^…].*" or ".+" branch 6 plus 1 per further excluded
# character, a piece joined into an alternation 2, a program 4.
_LITERAL, _BRANCH, _CLASS_CHAR, _ALTERNATIVE, _BASE = 1, 6, 1, 2, 4


def _trie(names: Iterable[str]) -> _Trie:
    """Names, and prefixes written `prefix*`, as a trie (a prefix subsumes what is below)."""
    root: _Trie = {}
    for name in names:
        stem = name.removesuffix("*")
        node = root
        for char in stem:
            if _ALL in node:
                break
            node = node.setdefault(char, {})
        else:
            if stem != name:
                node.clear()
                node[_ALL] = {}
            elif _ALL not in node:
                node[_END] = {}
    return root


def _escape(char: str) -> str:
    return char if char.isalnum() else "\\" + char


def _pieces(trie: _Trie) -> list[Piece]:
    """Every name the trie does not hold, pseudo-headers aside, as pieces under the budget.

    Each piece writes a node's complement nested as deep as the budget allows; a child
    that does not fit becomes a piece of its own, led by its whole prefix."""
    pieces: list[Piece] = []
    todo: list[tuple[str, int, _Trie, bool]] = [("", 0, trie, True)]
    while todo:
        prefix, length, node, root = todo.pop(0)
        budget = SIZE_BUDGET - _BASE - _ALTERNATIVE - length
        regex, size, deferred = _render(node, budget, prefix, length, root=root)
        pieces.append(Piece(prefix + regex, length + size + _ALTERNATIVE))
        todo.extend((p, n, child, False) for p, n, child in deferred)
    return pieces


def _render(
    node: _Trie, budget: int, prefix: str, length: int, *, root: bool = False
) -> tuple[str, int, list[tuple[str, int, _Trie]]]:
    """The names under `node` that are not allowed, within `budget`: (regex, its size,
    the children left out, each with its prefix and prefix length)."""
    alternatives, size = _here(node, root=root)
    deferred: list[tuple[str, int, _Trie]] = []
    for char in _children(node):
        child, child_prefix = node[char], prefix + _escape(char)
        if _ALL in child:
            continue  # the class above leaves out its first character: all kept
        remaining = budget - size - _LITERAL
        if remaining < _here(child)[1]:
            deferred.append((child_prefix, length + _LITERAL, child))
            continue
        regex, child_size, later = _render(child, remaining, child_prefix, length + _LITERAL)
        alternatives.append(_escape(char) + regex)
        size += _LITERAL + child_size
        deferred += later
    return _group(alternatives), size, deferred


def _children(node: _Trie) -> list[str]:
    return sorted(char for char in node if len(char) == 1)


def _group(alternatives: list[str]) -> str:
    if len(alternatives) == 1:
        return alternatives[0]
    return "(?:" + "|".join(alternatives) + ")"


def _here(node: _Trie, *, root: bool = False) -> tuple[list[str], int]:
    """Names that stop at this node when it is not an allowed name (never at the root),
    or leave the trie here: the next character is none of the children's (at the root,
    nor ':', so pseudo-headers stay). Past a leaf, anything longer."""
    children = _children(node)
    stop = [] if _END in node or root else [""]
    if not children:
        return [*stop, ".+"], _BRANCH
    excluded = ([":"] if root else []) + children
    branch = "[^" + "".join(_escape(char) for char in excluded) + "].*"
    return [*stop, branch], _BRANCH + _CLASS_CHAR * (len(excluded) - 1)
