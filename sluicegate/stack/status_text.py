"""`sluicegate status` as text: `up`'s /status document in sections and aligned tables.

Pure functions over the document (stack/up_http.py makes it), so any part of it may be
missing: the control plane's part when it does not answer, admission when the main
ext_proc server does not, `providers` without an Envoy of `up`'s own, `routing` from a
control plane older than latency routing. What is missing is said, never guessed.
`status_problems` is what makes `sluicegate status` exit 1 (docs/operations.md, "Status and
metrics"); the text marks the same things where they are.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

# The children `up` asks for its document, by the key that says one did not answer.
_ASKED: Final = ("control_plane", "ext_proc", "envoy")
# A NACK's error from Envoy can hold a whole resource; --json shows it whole.
_MAX_ERROR_CHARS: Final = 240


def status_problems(document: Mapping[str, Any]) -> list[str]:
    """Why the stack is not healthy, one line each; empty when it is. A process not up, a
    child not answering `up`, a last reload that failed (or none), a node whose last
    answer for a type is a NACK."""
    found = []
    for process in _dicts(document.get("processes")):
        if process.get("state") != "up":
            found.append(f"{process.get('kind')} {process.get('name')} is {process.get('state')}")
    found += [f"{part} is {document[part]}" for part in _ASKED if document.get(part)]
    last = document.get("last_reload")
    if document.get("control_plane"):
        pass  # said above; the reload is unknown, not failed
    elif not isinstance(last, Mapping):
        found.append("no config loaded")
    elif not last.get("ok", False):
        found.append("the last reload failed")
    for node in _dicts(document.get("nodes")):
        for type_url in sorted(_mapping(node.get("nacks"))):
            found.append(f"node {node.get('node_id')} rejected {short_type(type_url)}")
    return found


def render_status(document: Mapping[str, Any], now: float) -> str:
    """The whole text form; `now` (epoch seconds) dates the ages shown."""
    sections = [
        ("Config", _config(document, now)),
        ("Envoys", _envoys(document, now)),
        ("Providers", _providers(document)),
        ("Processes", _processes(document, now)),
        ("Admission", _admission(document)),
        *(
            [("Envoy's gates", _envoy_gates(document))]
            if _mapping(document.get("envoy_gates"))
            else []
        ),
        *([("Auto lane", _lanes(document))] if _mapping(document.get("lanes")) else []),
    ]
    return "\n\n".join("\n".join([title, *lines]) for title, lines in sections) + "\n"


def short_type(type_url: str) -> str:
    """`type.googleapis.com/envoy.config.cluster.v3.Cluster` -> `Cluster`."""
    return type_url.rsplit(".", 1)[-1].rsplit("/", 1)[-1]


# -- sections ---------------------------------------------------------------------------------


def _config(document: Mapping[str, Any], now: float) -> list[str]:
    if document.get("control_plane"):
        return [f"  the control plane is {document['control_plane']}: config unknown"]
    rows = [("file", str(document.get("config_file", "-")))]
    last = document.get("last_reload")
    problem_lines: list[str] = []
    if isinstance(last, Mapping):
        outcome = "ok" if last.get("ok") else "FAILED"
        rows.append(("last reload", f"{outcome}, {_when(last.get('at'), now)}"))
        problem_lines = [f"    {problem}" for problem in _strings(last.get("problems"))]
    else:
        rows.append(("last reload", "none yet"))
    rows.append(("drained", ", ".join(_strings(document.get("drained"))) or "none"))
    rows.append(("models", ", ".join(_strings(document.get("models"))) or "none"))
    native = _mapping(document.get("native_filters"))
    if native:
        rows.append(("native filters", f"{native.get('path') or 'none'} ({native.get('why')})"))
        for refused in _dicts(native.get("refused")):
            rows.append(("  refused", f"{refused.get('node_id')}: {refused.get('path')} "
                                      f"({refused.get('message')})"))  # fmt: skip
    lines = _pairs(rows)
    if problem_lines:
        index = 1 + next(i for i, (key, _) in enumerate(rows) if key == "last reload")
        lines[index:index] = problem_lines
    return lines


def _envoys(document: Mapping[str, Any], now: float) -> list[str]:
    if document.get("control_plane"):
        return ["  unknown (the control plane keeps the nodes' state)"]
    nodes = _dicts(document.get("nodes"))
    if not nodes:
        return ["  no Envoy is connected"]
    summary = [
        (
            str(node.get("node_id", "?")),
            str(node.get("role") or node.get("cluster") or "-"),
            str(node.get("stream_kind", "-")),
            f"since {_when(node.get('connected_since'), now)}"
            if node.get("connected", True)
            else f"disconnected {_when(node.get('disconnected_at'), now)}",
        )
        for node in nodes
    ]
    lines = _table(("NODE", "ROLE", "STREAM", "CONNECTED"), summary)
    for node in nodes:
        # Each node's own view: its class's snapshot (its native filters library), and
        # of each type only what it subscribed to (another Envoy's ECDS is not its).
        served = _mapping(node.get("serving"))
        native = f" (native filters: {node['class']})" if node.get("class") else ""
        lines += ["", f"  {node.get('node_id', '?')}{native}"]
        lines += _table(("TYPE", "ACKED", "LAST NACK"), _type_rows(node, served, now), indent=4)
    return lines


def _type_rows(
    node: Mapping[str, Any], served: Mapping[str, Any], now: float
) -> list[tuple[str, ...]]:
    acked = _mapping(node.get("acked"))
    live = _mapping(node.get("nacks"))
    last = _mapping(node.get("last_nacks")) or live
    rows = []
    for type_url in sorted(set(acked) | set(last) | set(_mapping(node.get("sent")))):
        version = acked.get(type_url)
        cell = str(version) if version else "none"
        current = served.get(type_url)
        if current and current != version and type_url not in live:
            cell += f" (serving {current})"
        rows.append((short_type(type_url), cell, _nack(last.get(type_url), type_url in live, now)))
    return sorted(rows)


def _nack(nack: Any, live: bool, now: float) -> str:
    if not isinstance(nack, Mapping):
        return "-"
    count = nack.get("count")
    times = f", {count}x" if isinstance(count, int) and count > 1 else ""
    state = "REJECTED NOW" if live else "since accepted"
    error = " ".join(str(nack.get("message", "")).split())
    if len(error) > _MAX_ERROR_CHARS:
        error = error[: _MAX_ERROR_CHARS - 1] + "…"
    return f"{nack.get('version', '?')} at {_when(nack.get('at'), now)}, {state}{times}: {error}"


def _providers(document: Mapping[str, Any]) -> list[str]:
    envoy = document.get("providers")
    envoy = envoy if isinstance(envoy, Mapping) else None
    routing = _mapping(document.get("routing"))
    lines = []
    if document.get("envoy"):
        lines.append(f"  Envoy's admin is {document['envoy']}: host health unknown")
    elif envoy is None:
        lines.append("  host health unknown: only `sluicegate up` reads it, from its own Envoy")
    if not routing and document.get("control_plane"):
        lines.append("  weights unknown (the control plane is not answering)")
    drained = set(_strings(document.get("drained")))
    rows = []
    for route in sorted(set(routing) | set(envoy or {})):
        held = _mapping((envoy or {}).get(route))
        learned = _mapping(routing.get(route))
        names = set(held) | set(learned)
        order = sorted(names, key=lambda name: (_mapping(held.get(name)).get("priority", 0), name))
        for name in order:
            views = (held.get(name), learned.get(name))
            rows.append(_provider_row(route, name, *views, known=envoy is not None,
                                      drained=name in drained))  # fmt: skip
    if not rows:
        return [*lines, "  no routes known"]
    header = ("ROUTE", "PROVIDER", "PRIORITY", "HEALTHY", "EJECTED", "HC FAILING",
              "WEIGHT", "CONFIGURED", "SHARE", "TTFT", "TPOT", "ERRORS")  # fmt: skip
    return [*lines, *_table(header, rows)]


def _provider_row(
    route: str, name: str, held: Any, learned: Any, *, known: bool, drained: bool
) -> tuple[str, ...]:
    """One provider of one route: Envoy's view (`held`) and the control plane's
    (`learned`, from `routing`)."""
    envoy = _mapping(held)
    plane = _mapping(learned)
    if envoy:
        healthy = f"{envoy.get('healthy', '?')}/{envoy.get('hosts', '?')}"
        ejected = str(envoy.get("ejected", "?"))
        failing = str(envoy.get("failed_health_check", "?"))
    else:
        # Not in Envoy's cluster: drained (the control plane took it out), or unknown.
        healthy = "drained" if drained else ("absent" if known else "?")
        ejected = failing = "-" if known else "?"
    weight = plane.get("weight", envoy.get("weight"))
    share = envoy.get("share", plane.get("share"))
    return (
        route,
        name,
        str(envoy.get("priority", "-")),
        healthy,
        ejected,
        failing,
        _number(weight),
        _number(plane.get("configured_weight")),
        _percent(share, 0),
        _seconds(plane.get("ttft_s")),
        _seconds(plane.get("tpot_s")),
        _percent(plane.get("error_rate"), 1),
    )


def _processes(document: Mapping[str, Any], now: float) -> list[str]:
    processes = _dicts(document.get("processes"))
    if not processes:
        return ["  none listed"]
    # A child `up` asked that did not answer, though its process is up (hung).
    silent = {kind for kind in _ASKED if document.get(kind)}
    rows = []
    for process in processes:
        state = str(process.get("state", "?"))
        kind = str(process.get("kind", "?"))
        if state == "up" and kind in silent:  # kinds `control_plane`, `ext_proc` (main), `envoy`
            state = f"up, {document[kind]}"
        last_exit = process.get("last_exit")
        rows.append((
            kind,
            str(process.get("name", "?")),
            str(process.get("pid") or "-"),
            state,
            str(process.get("restarts", "-")),
            _when(process.get("since"), now),
            "-" if last_exit is None else str(last_exit),
            str(process.get("address") or "-"),
        ))  # fmt: skip
    header = ("KIND", "NAME", "PID", "STATE", "RESTARTS", "SINCE", "LAST EXIT", "ADDRESS")
    return _table(header, rows)


def _admission(document: Mapping[str, Any]) -> list[str]:
    admission = document.get("admission")
    if not isinstance(admission, Mapping):
        if document.get("ext_proc"):
            return [f"  the main ext_proc server is {document['ext_proc']}: admission unknown"]
        return ["  unknown"]
    if admission.get("enabled") is False:
        return ["  off (no tenants, no gates)"]
    store = _mapping(admission.get("store"))
    described = f"{store.get('kind', '?')}, {store.get('state', '?')}"
    if store.get("on_failure") and store.get("state") == "down":
        # admission.store.on_failure decides until the store answers again.
        described = f"{store.get('kind', '?')}, DOWN, failing over to {store['on_failure']}"
    elif store.get("on_failure"):
        described += f" (on failure: {store['on_failure']})"
    lines = _pairs([
        ("limiter store", described),
        ("tenants", ", ".join(_strings(admission.get("tenants"))) or "none"),
    ])  # fmt: skip
    gates = _mapping(admission.get("gates"))
    if not gates:
        return [*lines, "  no gates"]
    classes = _strings(admission.get("priority_classes"))
    for gate in gates.values():  # a class a gate has that the list lacks: still shown
        classes += [c for c in _mapping(_mapping(gate).get("classes")) if c not in classes]
    tokens = any(_mapping(gate).get("max_tokens") is not None for gate in gates.values())
    header = ["GATE", "IN FLIGHT", *(["TOKENS"] if tokens else []), "QUEUED", *classes]
    rows = []
    for name in sorted(gates):
        gate = _mapping(gates[name])
        by_class = {c: _mapping(v) for c, v in _mapping(gate.get("classes")).items()}
        rows.append((
            name,
            _of(gate.get("in_flight"), gate.get("max_requests")),
            *([_of(gate.get("in_flight_tokens"), gate.get("max_tokens"))] if tokens else []),
            _of(gate.get("queued"), gate.get("max_queued")),
            *(_of(by_class[c].get("depth"), by_class[c].get("max_queue")) if c in by_class
              else "-" for c in classes),
        ))  # fmt: skip
    return [*lines, "", "  queued per class: waiting/queue size", *_table(header, rows)]


def _envoy_gates(document: Mapping[str, Any]) -> list[str]:
    """Each partition of each gate Envoy enforces (stack/envoy_gates.py): in flight and
    waiting of their limits, and the route's refusals since its Envoy started."""
    rows = []
    for route, gate in sorted(_mapping(document.get("envoy_gates")).items()):
        refused = _mapping(gate).get("refused")
        for index, partition in enumerate(_dicts(_mapping(gate).get("partitions"))):
            rows.append((
                route if index == 0 else "",
                str(partition.get("partition", "?"))
                + (f" ({partition['class']})" if partition.get("class") else ""),
                _of(partition.get("in_flight"), partition.get("max_requests")),
                _of(partition.get("waiting"), partition.get("max_pending")),
                ("-" if refused is None else str(refused)) if index == 0 else "",
            ))  # fmt: skip
    return [
        "  per partition of each route's gate, as this stack's Envoy holds it",
        *_table(("ROUTE", "PARTITION", "IN FLIGHT", "WAITING", "REFUSED"), rows),
    ]


def _lanes(document: Mapping[str, Any]) -> list[str]:
    """Each `auto` tenant: its lane, how long, its moves, and its fullest limit."""
    rows = []
    for tenant, state in sorted(_mapping(document.get("lanes")).items()):
        state = _mapping(state)
        limits = _dicts(state.get("limits"))
        fullest = max(
            limits, key=lambda limit: _share(limit.get("used"), limit.get("limit")), default=None
        )
        usage = "-"
        if fullest is not None:
            owner = f"key {fullest.get('key')}" if fullest.get("key") else "tenant"
            usage = (
                f"{owner} {fullest.get('kind')} {_of(fullest.get('used'), fullest.get('limit'))}"
                f" per {_number(fullest.get('window_s'))}s"
            )
        rows.append(
            (tenant, str(state.get("lane", "?")), _age(float(state.get("since_s") or 0)),
             str(state.get("moves", "?")), usage)
        )  # fmt: skip
    return _table(("TENANT", "LANE", "FOR", "MOVES", "FULLEST LIMIT"), rows)


def _share(used: Any, limit: Any) -> float:
    if isinstance(used, int | float) and isinstance(limit, int | float) and limit > 0:
        return float(used) / float(limit)
    return 0.0


# -- formatting -------------------------------------------------------------------------------


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], indent: int = 2) -> list[str]:
    """Left-aligned columns two spaces apart; trailing spaces dropped."""
    body = [list(header), *(list(row) for row in rows)]
    widths = [max(len(row[i]) for row in body) for i in range(len(header))]
    pad = " " * indent
    return [
        pad + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in body
    ]


def _pairs(rows: Sequence[tuple[str, str]]) -> list[str]:
    width = max(len(key) for key, _ in rows)
    return [f"  {key.ljust(width)}  {value}" for key, value in rows]


def _when(at: Any, now: float) -> str:
    """`20:04:08 (5m12s ago)` in local time, with the date when it is not `now`'s day;
    `-` when unknown."""
    if not isinstance(at, int | float) or isinstance(at, bool):
        return "-"
    moment = time.localtime(at)
    same_day = moment[:3] == time.localtime(now)[:3]
    clock = time.strftime("%H:%M:%S" if same_day else "%Y-%m-%d %H:%M:%S", moment)
    return f"{clock} ({_age(now - at)} ago)"


def _age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    return f"{hours // 24}d{hours % 24:02d}h"


def _seconds(value: Any) -> str:
    """A latency in seconds as ms below 10 s: `412 ms`, `15.2 ms`, `12.3 s`."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "-"
    if value >= 10:
        return f"{value:.1f} s"
    ms = value * 1000
    return f"{ms:.1f} ms" if ms < 100 else f"{ms:.0f} ms"


def _percent(value: Any, digits: int) -> str:
    """A share (0..1) as `75%`; `-` when unknown."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "-"
    return f"{100 * value:.{digits}f}%"


def _number(value: Any) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "-"
    return f"{value:.2f}".rstrip("0").rstrip(".") if isinstance(value, float) else str(value)


def _of(value: Any, limit: Any) -> str:
    """`3/8`, or `3` without a limit."""
    shown = "-" if value is None else str(value)
    return shown if limit is None else f"{shown}/{limit}"


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _dicts(value: Any) -> list[Mapping[str, Any]]:
    return [item for item in value if isinstance(item, Mapping)] if isinstance(value, list) else []


def _strings(value: Any) -> list[str]:
    return [str(item) for item in value] if isinstance(value, list) else []
