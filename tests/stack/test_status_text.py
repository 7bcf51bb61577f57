"""`sluicegate status` as text: pure rendering of `up`'s /status document, whole, partial
(a child not answering, sections missing or malformed), and what makes it exit 1."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from sluicegate.stack.status_text import render_status, short_type, status_problems

NOW = 1_800_000_000.0
LISTENER = "type.googleapis.com/envoy.config.listener.v3.Listener"
CLUSTER = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
NACK = {
    "version": "bad0bad0",
    "message": "Error adding/updating listener(s) gateway:\n  script load error",
    "at": NOW - 30,
    "nonce": "7",
    "code": 13,
}


def process(kind: str, name: str, state: str = "up", **extra: Any) -> dict[str, Any]:
    return {"kind": kind, "name": name, "address": "127.0.0.1:1", "pid": 100, "state": state,
            "since": NOW - 600, "restarts": 0, "last_exit": None, "log": None, **extra}  # fmt: skip


def gate(name: str, in_flight: int, depths: dict[str, int]) -> dict[str, Any]:
    return {
        "name": name, "in_flight": in_flight, "in_flight_tokens": 0, "queued": sum(depths.values()),
        "max_requests": 8, "max_tokens": None, "max_queued": None,
        "classes": {c: {"depth": d, "max_queue": 64} for c, d in depths.items()},
    }  # fmt: skip


def health(healthy: int, ejected: int = 0, weight: int = 1, share: float = 1.0) -> dict[str, Any]:
    return {"hosts": 1, "healthy": healthy, "ejected": ejected, "failed_health_check": 0,
            "weight": weight, "priority": 0, "share": share}  # fmt: skip


def learned(weight: float, configured: int, ttft_s: float, tpot_s: float,
            error_rate: float) -> dict[str, Any]:  # fmt: skip
    """A provider of a `routing: latency` route, as the control plane's /status shows it."""
    return {"weight": weight, "configured_weight": configured, "share": 0.5, "ttft_s": ttft_s,
            "tpot_s": tpot_s, "error_rate": error_rate, "samples": 40}  # fmt: skip


def document() -> dict[str, Any]:
    """A stack with one NACK fixed since, beta ejected from `mini`, a gate with a queue."""
    return {
        "config_file": "/etc/sluicegate/gateway.yaml",
        "last_reload": {"ok": True, "at": NOW - 192, "problems": [], "changed_types": []},
        "versions": {CLUSTER: "c1", LISTENER: "l2"},
        "models": ["gpt-4o-mini", "qwen-plus"],
        "drained": [],
        "routing": {
            "mini": {
                "alpha": learned(2.25, 3, 0.0612, 0.0101, 0.0),
                "beta": learned(1.0, 1, 0.42, 0.015, 0.125),
            }
        },
        "nodes": [
            {
                "node_id": "gateway-1",
                "cluster": "sluicegate",
                "stream_kind": "delta",
                "connected": True,
                "connected_since": NOW - 3600,
                "acked": {CLUSTER: "c1", LISTENER: "l2"},
                "sent": {CLUSTER: "c1", LISTENER: "l2"},
                "serving": {CLUSTER: "c1", LISTENER: "l2"},
                "nacks": {},
                "last_nacks": {LISTENER: {**NACK, "count": 2}},
            }
        ],
        "admission": {
            "enabled": True,
            "tenants": ["demo", "ops"],
            "priority_classes": ["interactive", "batch"],
            "store": {"kind": "redis", "on_failure": "local", "state": "down"},
            "gates": {"route:mini": gate("mini", 8, {"interactive": 2, "batch": 5})},
        },
        "providers": {
            "mini": {
                "alpha": health(1, weight=3, share=0.75),
                "beta": health(0, ejected=1, weight=1, share=0.25),
            },
            "qwen": {"alpha": health(1)},
        },
        "processes": [
            process("mock_provider", "alpha"),
            process("control_plane", "xds"),
            process("ext_proc", "main"),
            process("ext_proc_replica", "127.0.0.1:18002", restarts=3, last_exit=-9),
            process("envoy", "gateway-1"),
        ],
    }


def section(text: str, title: str) -> list[str]:
    """The lines of one section, its title left out."""
    lines = text.splitlines()
    start = lines.index(title) + 1
    end = next((i for i in range(start, len(lines)) if lines[i] and lines[i][0] != " "),
               len(lines))  # fmt: skip
    return [line for line in lines[start:end] if line]


def row(lines: list[str], *first: str) -> list[str]:
    """The cells of the table row that starts with `first` (cells hold no two spaces)."""
    for line in lines:
        cells = [cell.strip() for cell in line.strip().split("  ") if cell.strip()]
        if cells[: len(first)] == list(first):
            return cells
    raise AssertionError(f"no row {first} in:\n" + "\n".join(lines))


def test_every_section_in_order() -> None:
    text = render_status(document(), NOW)
    titles = [line for line in text.splitlines() if line and not line.startswith(" ")]
    assert titles == ["Config", "Envoys", "Providers", "Processes", "Admission"]
    assert status_problems(document()) == []


def test_config() -> None:
    lines = section(render_status(document(), NOW), "Config")
    assert row(lines, "file") == ["file", "/etc/sluicegate/gateway.yaml"]
    assert row(lines, "last reload")[1].startswith("ok, ") and "(3m12s ago)" in lines[1]
    assert row(lines, "drained") == ["drained", "none"]


def test_the_native_filters_line() -> None:
    doc = document()
    doc["native_filters"] = {"path": "/opt/lib.so", "why": "named"}
    lines = section(render_status(doc, NOW), "Config")
    assert row(lines, "native filters") == ["native filters", "/opt/lib.so (named)"]


def test_each_envoys_library_its_own_versions_and_the_refused() -> None:
    """With `node`: an Envoy in a class is named with its library and compared with the
    versions it is served, not the default's; a library an Envoy could not load is listed."""
    doc = document()
    doc["native_filters"] = {
        "setting": "node", "path": None, "why": "each Envoy's own",
        "refused": [{"node_id": "side-2", "path": "/x/lib.so", "message": "Failed to load"}],
    }  # fmt: skip
    node = doc["nodes"][0]
    node["class"] = "/opt/a/lib.so"
    node["acked"][LISTENER] = "l-native"
    node["serving"] = {CLUSTER: "c1", LISTENER: "l-native"}
    text = render_status(doc, NOW)
    config = section(text, "Config")
    assert row(config, "refused") == ["refused", "side-2: /x/lib.so (Failed to load)"]
    envoys = section(text, "Envoys")
    assert "gateway-1 (native filters: /opt/a/lib.so)" in [line.strip() for line in envoys]
    assert row(envoys, "Listener")[1] == "l-native"  # not "(serving l2)": it is served its own


def test_a_failed_reload_lists_its_problems_and_is_a_problem() -> None:
    doc = document()
    doc["drained"] = ["beta"]
    doc["last_reload"] = {"ok": False, "at": NOW - 5,
                          "problems": ["gateway.yaml:12: routes[0].models: required"]}  # fmt: skip
    lines = section(render_status(doc, NOW), "Config")
    assert row(lines, "last reload")[1].startswith("FAILED, ")
    assert "    gateway.yaml:12: routes[0].models: required" in lines
    assert row(lines, "drained") == ["drained", "beta"]
    assert status_problems(doc) == ["the last reload failed"]


def test_envoys_show_acked_versions_per_short_type_and_the_last_nack() -> None:
    lines = section(render_status(document(), NOW), "Envoys")
    assert row(lines, "NODE") == ["NODE", "ROLE", "STREAM", "CONNECTED"]
    node = row(lines, "gateway-1", "sluicegate")
    assert node[2] == "delta" and node[3].startswith("since ") and node[3].endswith("(1h00m ago)")
    assert row(lines, "Cluster") == ["Cluster", "c1", "-"]
    listener = row(lines, "Listener")
    assert listener[1] == "l2"
    # Fixed since (the node ACKed l2): shown, with Envoy's error on one line, not a problem.
    assert listener[2].startswith("bad0bad0 at ")
    assert "since accepted, 2x: Error adding/updating listener(s) gateway: script load error" in (
        " ".join(listener[2:])
    )


def test_a_nodes_role_is_shown_when_it_reports_one() -> None:
    doc = document()
    doc["nodes"][0]["role"] = "sidecar"
    assert row(section(render_status(doc, NOW), "Envoys"), "gateway-1")[1] == "sidecar"


def test_a_live_nack_is_marked_and_is_a_problem() -> None:
    doc = document()
    node = doc["nodes"][0]
    node["nacks"] = {LISTENER: NACK}
    node["acked"][LISTENER] = "l1"
    text = render_status(doc, NOW)
    assert "REJECTED NOW, 2x: Error adding" in text
    # The node serves l1 while the control plane serves l2: no "(serving ...)" while NACKed.
    assert row(section(text, "Envoys"), "Listener")[1] == "l1"
    assert status_problems(doc) == ["node gateway-1 rejected Listener"]


def test_a_node_behind_shows_what_is_served() -> None:
    """Against the version of the node's own view, not the document's `versions` (the
    snapshot's, which hash resources a node may never ask for)."""
    doc = document()
    doc["nodes"][0]["acked"][CLUSTER] = "c0"
    doc["versions"][LISTENER] = "l-all"
    envoys = section(render_status(doc, NOW), "Envoys")
    assert row(envoys, "Cluster")[1] == "c0 (serving c1)"
    assert row(envoys, "Listener")[1] == "l2"


def test_providers_merge_envoys_health_with_the_control_planes_weights() -> None:
    lines = section(render_status(document(), NOW), "Providers")
    header = ["ROUTE", "PROVIDER", "PRIORITY", "HEALTHY", "EJECTED", "HC FAILING",
              "WEIGHT", "CONFIGURED", "SHARE", "TTFT", "TPOT", "ERRORS"]  # fmt: skip
    assert row(lines, "ROUTE") == header
    assert row(lines, "mini", "alpha") == [
        "mini", "alpha", "0", "1/1", "0", "0", "2.25", "3", "75%", "61.2 ms", "10.1 ms", "0.0%"
    ]  # fmt: skip
    assert row(lines, "mini", "beta") == [
        "mini", "beta", "0", "0/1", "1", "0", "1", "1", "25%", "420 ms", "15.0 ms", "12.5%"
    ]  # fmt: skip
    # A static route the control plane reports nothing for: Envoy's weight, no figures.
    assert row(lines, "qwen", "alpha")[3:] == ["1/1", "0", "0", "1", "-", "100%", "-", "-", "-"]
    # Columns line up: every cell of a column starts where its header does.
    table = [line for line in lines if line.startswith("  ROUTE") or line.startswith("  mini")]
    column = table[0].index("WEIGHT")
    assert all(line[column - 2 : column] == "  " and line[column] != " " for line in table)


def test_providers_when_envoy_does_not_answer() -> None:
    doc = document()
    doc["envoy"] = "not answering"
    doc["providers"] = None
    lines = section(render_status(doc, NOW), "Providers")
    assert lines[0] == "  Envoy's admin is not answering: host health unknown"
    assert row(lines, "mini", "beta")[2:6] == ["-", "?", "?", "?"]
    assert row(lines, "mini", "beta")[6:8] == ["1", "1"]  # weights still from the control plane
    assert "envoy is not answering" in status_problems(doc)
    assert row(section(render_status(doc, NOW), "Processes"), "envoy")[3] == "up, not answering"


def test_a_drained_provider_is_shown_as_such() -> None:
    doc = document()
    doc["drained"] = ["beta"]
    del doc["providers"]["mini"]["beta"]  # the control plane took it out of Envoy's cluster
    lines = section(render_status(doc, NOW), "Providers")
    assert row(lines, "mini", "beta")[2:6] == ["-", "drained", "-", "-"]


def test_processes_with_restarts_and_last_exit() -> None:
    lines = section(render_status(document(), NOW), "Processes")
    assert row(lines, "KIND") == ["KIND", "NAME", "PID", "STATE", "RESTARTS", "SINCE",
                                  "LAST EXIT", "ADDRESS"]  # fmt: skip
    replica = row(lines, "ext_proc_replica")
    assert replica[:5] == ["ext_proc_replica", "127.0.0.1:18002", "100", "up", "3"]
    assert replica[5].endswith("(10m00s ago)") and replica[6:] == ["-9", "127.0.0.1:1"]


def test_a_process_down_is_a_problem() -> None:
    doc = document()
    doc["processes"][3].update(state="starting", pid=None)
    assert row(section(render_status(doc, NOW), "Processes"), "ext_proc_replica")[2:4] == [
        "-", "starting"
    ]  # fmt: skip
    assert status_problems(doc) == ["ext_proc_replica 127.0.0.1:18002 is starting"]


def test_admission_store_and_gates_with_depths_per_class() -> None:
    lines = section(render_status(document(), NOW), "Admission")
    assert row(lines, "limiter store") == ["limiter store", "redis, DOWN, failing over to local"]
    assert row(lines, "tenants") == ["tenants", "demo, ops"]
    assert row(lines, "GATE") == ["GATE", "IN FLIGHT", "QUEUED", "interactive", "batch"]
    assert row(lines, "route:mini") == ["route:mini", "8/8", "7", "2/64", "5/64"]


def test_a_limiter_store_that_answers() -> None:
    doc = document()
    doc["admission"]["store"]["state"] = "up"
    lines = section(render_status(doc, NOW), "Admission")
    assert row(lines, "limiter store") == ["limiter store", "redis, up (on failure: local)"]


def test_a_hung_control_plane() -> None:
    """What `up` answers when the control plane does not: its part is missing."""
    doc = {key: value for key, value in document().items()
           if key in ("admission", "providers", "processes")}  # fmt: skip
    doc.update(control_plane="not answering", last_reload=None)
    text = render_status(doc, NOW)
    assert section(text, "Config") == ["  the control plane is not answering: config unknown"]
    assert section(text, "Envoys") == ["  unknown (the control plane keeps the nodes' state)"]
    providers = section(text, "Providers")
    assert providers[0] == "  weights unknown (the control plane is not answering)"
    assert row(providers, "mini", "beta")[3] == "0/1"
    assert row(section(text, "Processes"), "control_plane")[3] == "up, not answering"
    assert status_problems(doc) == ["control_plane is not answering"]


def test_a_hung_main_ext_proc() -> None:
    doc = document()
    doc.update(ext_proc="not answering", admission=None)
    text = render_status(doc, NOW)
    assert section(text, "Admission") == [
        "  the main ext_proc server is not answering: admission unknown"
    ]
    assert row(section(text, "Processes"), "ext_proc", "main")[3] == "up, not answering"
    assert row(section(text, "Processes"), "ext_proc_replica")[3] == "up"
    assert status_problems(doc) == ["ext_proc is not answering"]


def test_a_control_planes_own_document() -> None:
    """`sluicegate status --address` at a control plane run alone: no processes, no
    admission, no Envoy of its own, no `routing` (a control plane before latency routing)."""
    doc = {key: value for key, value in document().items()
           if key not in ("admission", "providers", "processes", "routing")}  # fmt: skip
    text = render_status(doc, NOW)
    assert section(text, "Providers") == [
        "  host health unknown: only `sluicegate up` reads it, from its own Envoy",
        "  no routes known",
    ]
    assert section(text, "Processes") == ["  none listed"]
    assert section(text, "Admission") == ["  unknown"]
    assert status_problems(doc) == []


@pytest.mark.parametrize(
    "broken",
    [
        {},
        {"processes": "x", "nodes": {"a": 1}, "admission": [], "providers": "x", "routing": 3},
        {"nodes": [{"acked": {LISTENER: None}, "last_nacks": {LISTENER: "x"}}, 5],
         "last_reload": {"ok": True, "at": "yesterday", "problems": None}},
        {"admission": {"store": None, "gates": {"g": None, "h": {"classes": {"x": None}}}},
         "processes": [{"kind": "envoy"}, None]},
        {"providers": {"r": {"p": None}, "s": None}, "routing": {"r": {"q": {"weight": "w"}}},
         "drained": "beta"},
    ],
)  # fmt: skip
def test_malformed_or_missing_parts_never_raise(broken: dict[str, Any]) -> None:
    doc = copy.deepcopy(document())
    doc.update(broken)
    for shown in (doc, broken):
        text = render_status(shown, NOW)
        assert text.startswith("Config\n") and "\nAdmission\n" in text
        status_problems(shown)


def test_no_config_loaded_is_a_problem() -> None:
    assert status_problems({"processes": [], "last_reload": None}) == ["no config loaded"]


def test_dates_show_when_not_today() -> None:
    doc = document()
    doc["processes"][0]["since"] = NOW - 3 * 86400
    cells = row(section(render_status(doc, NOW), "Processes"), "mock_provider")
    assert cells[5].count("-") == 2 and cells[5].endswith("(3d00h ago)")


def test_short_type() -> None:
    assert short_type(LISTENER) == "Listener"
    assert short_type("Cluster") == "Cluster"
