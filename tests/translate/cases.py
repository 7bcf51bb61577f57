"""The translator's test cases: ordinary config files in testdata/in/, one feature each.

    translate_case(path)   # the file loaded, keys resolved, drains applied, translated
    model_of(case)         # the resolved model of testdata/in/<case>.yaml
    exact_lane_model_of(case)  # the same, routed by the routing stage (`lane: exact`)
    CASES[case]            # (YAML text, resolved keys), for tests that edit the text

Provider keys come from the files' `api_key` sources, as for a user: `file:` sources
from testdata/in/keys/, `env:` sources from `fake_environment`, which invents an
obviously fake key for every variable a file names (the real environment is not read).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from google.protobuf.message import Message

from sluicegate.config import Config, load_config, resolve_api_keys, resolve_client_keys
from sluicegate.model import Gateway, build_model
from sluicegate.native import MODULE, build, resolve_module
from sluicegate.xds.translate import translate

TESTDATA = Path(__file__).parent / "testdata"
IN = TESTDATA / "in"


def case_names() -> list[str]:
    return sorted(path.stem for path in IN.glob("*.yaml"))


def case_path(case: str) -> Path:
    return IN / f"{case}.yaml"


def fake_environment(config: Config) -> dict[str, str]:
    """`sk-fake-<variable>` for every `api_key: {env: VARIABLE}` in `config`."""
    names = [p.api_key.env for p in config.providers if p.api_key and p.api_key.env]
    return {name: "sk-fake-" + name.lower().replace("_", "-") for name in names}


def load_case(path: Path) -> tuple[Config, dict[str, str | None]]:
    """The validated config and its provider keys, read as the control plane reads them."""
    config = load_config(path)
    return config, resolve_api_keys(config, path, env=fake_environment(config))


def model_from(
    config: Config, keys: dict[str, str | None], path: Path | None = None
) -> Gateway:
    """The one place the tests build the resolved model (as the control plane does, with
    the file's drains and none made live, and the client keys' secrets of the file at
    `path`)."""
    client_keys = None if path is None else resolve_client_keys(config, path, env={})
    # A case names the native library by a path, which resolves without a build.
    native = resolve_module(config.native_filters.module).path
    return build_model(config, keys, client_keys=client_keys, native_module=native)


def for_this_envoy(resources: dict[str, list[Message]], model: Gateway) -> dict[str, list[Message]]:
    """`resources` as an Envoy on this machine can load them: a case's native library path
    (which Envoy refuses to load when it is not there) replaced by a fresh build's."""
    if model.native_module is None:
        return resources
    return translate(replace(model, native_module=str(build(MODULE))))


def translate_case(path: Path) -> dict[str, list[Message]]:
    """Every resource of the config file at `path`, keyed by type URL."""
    return translate(model_from(*load_case(path), path))


def model_of(case: str) -> Gateway:
    path = case_path(case)
    if not path.is_file():
        raise KeyError(f"no case {case!r}: {path} does not exist")
    return model_from(*load_case(path), path)


def exact_lane_model_of(case: str) -> Gateway:
    """The model of testdata/in/<case>.yaml with `admission.lane: exact`: the routing
    stage routes (for tests of its translation; a case without tenants or limits is
    Envoy's by default, config/lane_rules.py)."""
    path = case_path(case)
    data: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    data.setdefault("admission", {})["lane"] = "exact"
    config = Config.model_validate(data)
    return model_from(config, resolve_api_keys(config, path, env=fake_environment(config)))


def config_of(document: str) -> Config:
    """A Config from YAML text, schema rules only (for tests that write their own)."""
    data: dict[str, Any] = yaml.safe_load(document)
    return Config.model_validate(data)


class _Cases(Mapping[str, tuple[str, dict[str, str | None]]]):
    """Case name -> (YAML text, resolved keys), read on access: a broken case fails the
    tests that use it, not the collection of every module that imports this one."""

    def __getitem__(self, case: str) -> tuple[str, dict[str, str | None]]:
        path = case_path(case)
        if not path.is_file():
            raise KeyError(case)
        return path.read_text(encoding="utf-8"), load_case(path)[1]

    def __iter__(self) -> Iterator[str]:
        return iter(case_names())

    def __len__(self) -> int:
        return len(case_names())


CASES = _Cases()
