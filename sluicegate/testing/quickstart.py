"""The quickstart config (examples/quickstart.yaml in a checkout) on free ports, for tests
and benchmarks that start real stacks beside each other."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml

from .ports import free_ports

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def quickstart_on_free_ports(tmp: Path) -> dict[str, Any]:
    """The quickstart document with every port moved to a free one."""
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())
    shutil.copytree(EXAMPLES / "keys", tmp / "keys", dirs_exist_ok=True)
    mocks = [provider for provider in doc["providers"] if "mock" in provider]
    ports = iter(free_ports(4 + len(doc["listeners"]) + len(mocks)))
    doc["sluicegate"] = {
        key: f"127.0.0.1:{next(ports)}" for key in ("xds", "ext_proc", "http", "envoy_admin")
    }
    for listener in doc["listeners"]:
        listener["port"] = next(ports)
    for provider in mocks:
        provider["base_url"] = f"http://127.0.0.1:{next(ports)}/v1"
    return doc
