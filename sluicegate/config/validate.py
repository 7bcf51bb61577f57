"""Rules that span the document: names, references between sections, models, URLs.

Each rule takes the valid parts of a document and returns Problems located by key
path. Socket collisions live in `sockets.py`.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

from .document import Document
from .problems import Problem
from .sockets import check_sockets
from .source import Locator, format_key_path

Rule = Callable[[Document, Locator], Iterable[Problem]]

MOCK_HOSTS = ("127.0.0.1",)  # `up` binds mocks there; localhost may resolve to ::1


def check_document(doc: Document, at: Locator) -> list[Problem]:
    """Every cross-document problem in `doc`."""
    return [problem for rule in RULES for problem in rule(doc, at)]


def check_unique_names(doc: Document, at: Locator) -> Iterable[Problem]:
    for section, names in doc.names.items():
        kind = section.removesuffix("s")
        first: dict[str, int] = {}
        for index, name in names:
            if name in first:
                earlier = (section, first[name], "name")
                yield at.error(
                    (section, index, "name"),
                    f"duplicate {kind} name '{name}' (first at {_where(at, earlier)})",
                )
            else:
                first[name] = index


def check_backends(doc: Document, at: Locator) -> Iterable[Problem]:
    known = doc.provider_names
    seen: dict[tuple[int, str], int] = {}  # (route, provider) -> first backend index
    for ref in doc.backends:
        path = ("routes", ref.route, "backends", ref.backend, "provider")
        first = seen.setdefault((ref.route, ref.provider), ref.backend)
        if ref.provider not in known:
            yield at.error(path, _unknown_provider(ref.provider, known))
        elif first != ref.backend:
            earlier = ("routes", ref.route, "backends", first, "provider")
            yield at.error(
                path,
                f"provider '{ref.provider}' is already a backend of route '{ref.route_name}' "
                f"(at {_where(at, earlier)}); give it one entry with the combined weight",
            )


def check_models(doc: Document, at: Locator) -> Iterable[Problem]:
    owner: dict[tuple[str, str], tuple[int, int]] = {}  # (path_prefix, model) -> (route, index)
    for r, route in doc.routes:
        listed: set[str] = set()
        for m, model in enumerate(route.models):
            path = ("routes", r, "models", m)
            if model in listed:
                yield at.warning(path, f"model '{model}' is listed twice in route '{route.name}'")
                continue
            listed.add(model)
            key = (route.path_prefix, model)
            if key in owner:
                other_r, other_m = owner[key]
                other = dict(doc.routes)[other_r]
                first = _where(at, ("routes", other_r, "models", other_m))
                yield at.error(
                    path,
                    f"model '{model}' under path_prefix '{route.path_prefix}' is already served "
                    f"by route '{other.name}' (at {first})",
                )
            else:
                owner[key] = (r, m)


def check_provider_use(doc: Document, at: Locator) -> Iterable[Problem]:
    """Providers no route uses, model_map entries no route needs, models a mock lacks."""
    if not doc.complete:
        return  # a route that failed validation may be the one that uses them
    routed: dict[str, set[str]] = {}  # provider -> models that routes send to it
    for _, route in doc.routes:
        for backend in route.backends:
            routed.setdefault(backend.provider, set()).update(route.models)
    for p, provider in doc.providers:
        models = routed.get(provider.name)
        if models is None:
            if doc.routes:
                yield at.warning(
                    ("providers", p, "name"),
                    f"no route sends traffic to provider '{provider.name}'",
                )
            continue
        for client_model in provider.model_map:
            if client_model not in models:
                yield at.warning(
                    ("providers", p, "model_map", client_model),
                    f"no route sends model '{client_model}' to provider '{provider.name}', "
                    "so this mapping is never used",
                )
        if provider.mock is not None and provider.mock.models:
            served = provider.mock.models
            for client_model in sorted(models):
                upstream = provider.model_map.get(client_model, client_model)
                if upstream not in served:
                    shown = f"'{client_model}'" + (
                        f" (as '{upstream}')" if upstream != client_model else ""
                    )
                    yield at.warning(
                        ("providers", p, "mock", "models"),
                        f"routes send model {shown} to mock provider '{provider.name}', "
                        f"which serves only: {', '.join(served)}",
                    )


def check_tls(doc: Document, at: Locator) -> Iterable[Problem]:
    for p, provider in doc.providers:
        if provider.tls is not None and urlsplit(provider.base_url).scheme != "https":
            yield at.error(
                ("providers", p, "tls"),
                "tls settings need an https:// base_url; this provider is reached over http://",
            )


def check_mock_urls(doc: Document, at: Locator) -> Iterable[Problem]:
    """`sluicegate up` starts mock providers itself, so their URL must be a local socket."""
    for p, provider in doc.providers:
        if provider.mock is None:
            continue
        path = ("providers", p, "base_url")
        parts = urlsplit(provider.base_url)
        if parts.scheme != "http":
            yield at.error(path, "a mock provider is served over plain http://, not https://")
        if parts.hostname not in MOCK_HOSTS:
            yield at.error(
                path,
                f"a mock provider runs on this machine: use host {' or '.join(MOCK_HOSTS)}, "
                f"not '{parts.hostname}'",
            )
        if parts.port is None:
            yield at.error(
                path,
                "a mock provider needs an explicit port, e.g. http://127.0.0.1:8101",
            )


def _unknown_provider(name: str, known: tuple[str, ...]) -> str:
    message = f"unknown provider '{name}' (known: {', '.join(known) or 'none'})"
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if close:
        message += f"; did you mean '{close[0]}'?"
    return message


def _where(at: Locator, path: tuple[str | int, ...]) -> str:
    return f"{format_key_path(path)}, line {at.source.line_of(path)}"


RULES: tuple[Rule, ...] = (
    check_unique_names,
    check_backends,
    check_models,
    check_provider_use,
    check_tls,
    check_mock_urls,
    check_sockets,
)
