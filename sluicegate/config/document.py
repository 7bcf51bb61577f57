"""The parts of a document that passed schema validation, with their list positions.

Cross-document rules run on a `Document` rather than on `Config`, so that a file
with one malformed provider still gets its routes, names and addresses checked:
every problem in a file is reported in one go.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from .admission import NAME_PATTERN, Admission, ClientKey, Tenant
from .lane_rules import Declared, with_default_lane
from .resilience import Resilience
from .schema import (
    AccessLog,
    Addresses,
    Config,
    Listener,
    Provider,
    Route,
    count_ext_proc_processes,
)

_M = TypeVar("_M", bound=BaseModel)


@dataclass(frozen=True)
class BackendRef:
    """`routes[route].backends[backend].provider` names `provider`."""

    route: int
    route_name: str
    backend: int
    provider: str


@dataclass(frozen=True)
class KeyRef:
    """`tenants[tenant].keys[index]` is `key`."""

    tenant: int
    tenant_name: str
    index: int
    key: ClientKey


@dataclass(frozen=True)
class ScenarioRef:
    """`routes[route].scenario` names `scenario`."""

    route: int
    route_name: str
    scenario: str


Dropped = frozenset[tuple[str | int, ...]]
"""Key paths (relative to a section) whose values failed validation and were left out."""


@dataclass(frozen=True)
class SettingsRoute:
    """A route whose resilience settings can be checked: `dropped` lists the keys that
    failed validation and were left out (empty for a valid route), so that rules about
    them stay quiet instead of judging the default that stands in for them."""

    index: int
    route: Route
    dropped: Dropped = frozenset()


@dataclass(frozen=True)
class Document:
    """Valid entries of each section, each with its index in the YAML list."""

    # sluicegate.* fields that are valid (defaults included), by field name
    addresses: Mapping[str, str]
    # sluicegate.ext_proc_replicas entries that are valid, with their index
    replica_addresses: tuple[tuple[int, str], ...]
    listeners: tuple[tuple[int, Listener], ...]
    providers: tuple[tuple[int, Provider], ...]
    routes: tuple[tuple[int, Route], ...]
    # Every backend whose provider is a string, even in routes that failed validation.
    backends: tuple[BackendRef, ...]
    # Every name written in each section ("listeners", "providers", "routes", "tenants")
    # with its index, even on entries that failed validation: a route naming a broken provider
    # is not also told the name is unknown, and duplicate names are always found.
    names: Mapping[str, tuple[tuple[int, str], ...]]
    # False when some listener, provider or route failed validation: rules that need
    # the whole picture (e.g. "no route uses this provider") must then stay quiet.
    complete: bool
    # The top-level `defaults:` (pools, timeouts, retries, outlier detection), or None
    # when it failed validation: rules on a route's effective settings then stay quiet.
    defaults: Resilience | None = None
    # Keys of `defaults:` that failed validation and were left out of `defaults`.
    defaults_dropped: Dropped = frozenset()
    # Every route whose settings can be checked, including routes that failed validation
    # elsewhere (a unitless duration must not hide `backoff.base > backoff.max`).
    settings_routes: tuple[SettingsRoute, ...] = ()
    # Valid tenants with their index; `admission:` (None when it failed validation);
    # every client key that is valid on its own, even inside a tenant that is not, so
    # duplicate key names and hashes are always found.
    tenants: tuple[tuple[int, Tenant], ...] = ()
    admission: Admission | None = None
    client_keys: tuple[KeyRef, ...] = ()
    # Every string written in `scenarios:` with its index, even one that is no valid name
    # (a route naming it is not also told it is unknown); None when `scenarios:` is not a
    # list, so no route's scenario can be judged.
    scenarios: tuple[tuple[int, str], ...] | None = ()
    # Every route's `scenario` that is a well-formed name, even in routes that failed
    # validation (a malformed one is reported as such, not also as unknown).
    route_scenarios: tuple[ScenarioRef, ...] = ()
    # `access_log:`, None when absent or invalid.
    access_log: AccessLog | None = None

    @property
    def provider_names(self) -> tuple[str, ...]:
        """Each provider name once, in file order (duplicates are reported on their own)."""
        return tuple(dict.fromkeys(name for _, name in self.names["providers"]))

    def ext_proc_processes(self) -> int:
        """`Config.ext_proc_processes` for the valid parts (`schema.count_ext_proc_processes`)."""
        store_replicas = 1 if self.admission is None else self.admission.store.replicas
        return count_ext_proc_processes(len(self.replica_addresses), store_replicas)

    @classmethod
    def from_config(cls, config: Config) -> Document:
        return cls(
            addresses={
                name: value
                for name, value in config.sluicegate.model_dump().items()
                if isinstance(value, str)
            },
            replica_addresses=tuple(enumerate(config.sluicegate.ext_proc_replicas)),
            listeners=tuple(enumerate(config.listeners)),
            providers=tuple(enumerate(config.providers)),
            routes=tuple(enumerate(config.routes)),
            backends=tuple(
                BackendRef(r, route.name, b, backend.provider)
                for r, route in enumerate(config.routes)
                for b, backend in enumerate(route.backends)
            ),
            names={
                "listeners": tuple(enumerate(x.name for x in config.listeners)),
                "providers": tuple(enumerate(x.name for x in config.providers)),
                "routes": tuple(enumerate(x.name for x in config.routes)),
                "tenants": tuple(enumerate(x.name for x in config.tenants)),
            },
            complete=True,
            defaults=config.defaults,
            settings_routes=tuple(SettingsRoute(r, route) for r, route in enumerate(config.routes)),
            tenants=tuple(enumerate(config.tenants)),
            admission=config.admission,
            client_keys=tuple(
                KeyRef(t, tenant.name, k, key)
                for t, tenant in enumerate(config.tenants)
                for k, key in enumerate(tenant.keys)
            ),
            scenarios=tuple(enumerate(config.scenarios)),
            route_scenarios=tuple(
                ScenarioRef(r, route.name, route.scenario)
                for r, route in enumerate(config.routes)
                if route.scenario is not None
            ),
            access_log=config.access_log,
        )

    @classmethod
    def salvage(cls, data: Mapping[object, object]) -> Document:
        """Validate each entry (and each sluicegate address) on its own, keeping those that pass."""
        raw = {name: _items(data.get(name)) for name in ("listeners", "providers", "routes")}
        listeners = _valid_items(Listener, raw["listeners"])
        providers = _valid_items(Provider, raw["providers"])
        routes = _valid_items(Route, raw["routes"])
        valid = len(listeners) + len(providers) + len(routes)
        raw_tenants = _items(data.get("tenants"))
        tenants = _valid_items(Tenant, raw_tenants)
        scenarios = _scenarios(data.get("scenarios", []))
        admission = _valid(Admission, data.get("admission", {}))
        if admission is not None:
            declared = Declared(
                tenants=[tenant for _, tenant in tenants],
                providers=[provider for _, provider in providers],
                routes=[route for _, route in routes],
                tenants_complete=len(tenants) == len(raw_tenants),
            )
            admission = with_default_lane(admission, declared)
        defaults, defaults_dropped = salvage_model(Resilience, data.get("defaults", {}))
        return cls(
            addresses=_valid_addresses(data.get("sluicegate", {})),
            replica_addresses=_valid_replicas(data.get("sluicegate", {})),
            listeners=listeners,
            providers=providers,
            routes=routes,
            backends=tuple(_backend_refs(raw["routes"])),
            names={section: tuple(_names(items)) for section, items in raw.items()}
            | {"tenants": tuple(_names(raw_tenants))},
            complete=valid == sum(len(items) for items in raw.values()),
            defaults=defaults,
            defaults_dropped=defaults_dropped,
            settings_routes=tuple(_settings_routes(raw["routes"])),
            tenants=tenants,
            admission=admission,
            client_keys=tuple(_key_refs(raw_tenants)),
            scenarios=scenarios,
            route_scenarios=tuple(_scenario_refs(raw["routes"])),
            access_log=_valid(AccessLog, data.get("access_log")),
        )


def _names(items: list[dict[object, object]]) -> Iterator[tuple[int, str]]:
    for index, item in enumerate(items):
        name = item.get("name")
        if isinstance(name, str):
            yield index, name


def _items(raw: object) -> list[dict[object, object]]:
    """Mapping entries of a section list (other entries can only fail validation)."""
    if not isinstance(raw, list):
        return []
    return [item if isinstance(item, dict) else {} for item in raw]


def _valid(model: type[_M], raw: object) -> _M | None:
    try:
        return model.model_validate(raw)
    except ValidationError:
        return None


def _valid_items(model: type[_M], items: list[dict[object, object]]) -> tuple[tuple[int, _M], ...]:
    valid = ((index, _valid(model, item)) for index, item in enumerate(items))
    return tuple((index, item) for index, item in valid if item is not None)


def salvage_model(model: type[_M], raw: object) -> tuple[_M | None, Dropped]:
    """`raw` validated as `model` after leaving out every key that fails validation.

    Returns the model (None when even that fails, e.g. a required key is missing) and the
    key paths left out. Each round drops at least one key, so this ends.
    """
    if not isinstance(raw, dict):
        return _valid(model, raw), frozenset()
    data = copy.deepcopy(raw)
    dropped: set[tuple[str | int, ...]] = set()
    while True:
        try:
            return model.model_validate(data), frozenset(dropped)
        except ValidationError as exc:
            paths = [_key_to_drop(data, error["loc"]) for error in exc.errors(include_url=False)]
        before = len(dropped)
        # Shortest first: a key inside one already dropped is gone with it.
        for path in sorted({path for path in paths if path is not None}, key=len):
            if not any(path[: len(done)] == done for done in dropped):
                _delete(data, path)
                dropped.add(path)
        if None in paths or len(dropped) == before:
            return None, frozenset(dropped)


def _key_to_drop(data: object, loc: Sequence[str | int]) -> tuple[str | int, ...] | None:
    """Path of the deepest mapping key on `loc` present in `data`; None if there is none
    (a required key is missing at the top: nothing can be dropped to fix it)."""
    current, found = data, None
    for depth, part in enumerate(loc):
        if isinstance(current, dict) and part in current:
            found = tuple(loc[: depth + 1])
            current = current[part]
        elif isinstance(current, list) and isinstance(part, int) and 0 <= part < len(current):
            current = current[part]
        else:
            break
    return found


def _delete(data: object, path: tuple[str | int, ...]) -> None:
    """Delete the mapping key at `path` (found by `_key_to_drop`, so every step exists)."""
    current = data
    for part in path[:-1]:
        if isinstance(current, list):
            current = current[int(part)]
        elif isinstance(current, dict):
            current = current[part]
    if isinstance(current, dict):
        del current[path[-1]]


def _settings_routes(routes: list[dict[object, object]]) -> Iterator[SettingsRoute]:
    for index, item in enumerate(routes):
        route, dropped = salvage_model(Route, item)
        if route is not None:
            yield SettingsRoute(index, route, dropped)


def _valid_addresses(raw: object) -> dict[str, str]:
    if not isinstance(raw, dict):
        return {}
    addresses: dict[str, str] = {}
    for name, default in Addresses().model_dump().items():
        if not isinstance(default, str):
            continue
        checked = _valid(Addresses, {name: raw[name]}) if name in raw else None
        if name not in raw:
            addresses[name] = default
        elif checked is not None:
            addresses[name] = getattr(checked, name)
    return addresses


def _valid_replicas(raw: object) -> tuple[tuple[int, str], ...]:
    replicas = raw.get("ext_proc_replicas") if isinstance(raw, dict) else None
    if not isinstance(replicas, list):
        return ()
    valid = []
    for index, address in enumerate(replicas):
        if _valid(Addresses, {"ext_proc_replicas": [address]}) is not None:
            valid.append((index, str(address)))
    return tuple(valid)


def _backend_refs(routes: list[dict[object, object]]) -> list[BackendRef]:
    refs = []
    for r, route in enumerate(routes):
        name = route.get("name")
        backends = route.get("backends")
        if not isinstance(backends, list):
            continue
        if not isinstance(name, str):
            name = f"routes[{r}]"
        for b, backend in enumerate(backends):
            provider = backend.get("provider") if isinstance(backend, dict) else None
            if isinstance(provider, str):
                refs.append(BackendRef(r, name, b, provider))
    return refs


def _key_refs(tenants: list[dict[object, object]]) -> list[KeyRef]:
    refs = []
    for t, tenant in enumerate(tenants):
        name = tenant.get("name")
        if not isinstance(name, str):
            name = f"tenants[{t}]"
        for k, item in enumerate(_items(tenant.get("keys"))):
            key = _valid(ClientKey, item)
            if key is not None:
                refs.append(KeyRef(t, name, k, key))
    return refs


def _scenarios(raw: object) -> tuple[tuple[int, str], ...] | None:
    if not isinstance(raw, list):
        return None
    return tuple((index, name) for index, name in enumerate(raw) if isinstance(name, str))


def _scenario_refs(routes: list[dict[object, object]]) -> list[ScenarioRef]:
    refs = []
    for r, route in enumerate(routes):
        name = route.get("name")
        scenario = route.get("scenario")
        # A malformed name is reported as such, not also as unknown.
        if isinstance(scenario, str) and re.fullmatch(NAME_PATTERN, scenario):
            refs.append(ScenarioRef(r, name if isinstance(name, str) else f"routes[{r}]", scenario))
    return refs
