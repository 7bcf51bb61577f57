"""Feed translated resources to a real Envoy 1.40 without an xDS server.

`static_bootstrap` inlines what xDS would deliver (RDS → route_config, EDS → a STATIC
cluster with the same ClusterLoadAssignment), so `envoy --mode validate` checks every
generated message, and a running Envoy serves exactly what the control plane would push.
`ads_bootstrap` keeps listeners and clusters as generated (rds / eds_config over ADS) to
check those config sources too. Provider keys (SDS over ADS when pushed) become static
secrets in `static_bootstrap`, referenced by name; `ads_bootstrap` keeps them on ADS.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from sluicegate import wire
from sluicegate.envoy import find_envoy_binary
from sluicegate.xds.translate import CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET

ENVOY = find_envoy_binary()



def to_dict(message: Message) -> dict[str, Any]:
    """Plain dicts (MessageToDict may return OrderedDicts for Any), proto field names."""
    plain: dict[str, Any] = json.loads(
        json.dumps(MessageToDict(message, preserving_proto_field_name=True))
    )
    return plain


def _grpc_cluster(name: str, port: int) -> dict[str, Any]:
    """A static HTTP/2 cluster (what the real bootstrap declares for xDS and ext_proc)."""
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/"
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [
                {
                    "lb_endpoints": [
                        {
                            "endpoint": {
                                "address": {
                                    "socket_address": {"address": "127.0.0.1", "port_value": port}
                                }
                            }
                        }
                    ]
                }
            ],
        },
    }


def static_bootstrap(
    resources: Mapping[str, Sequence[Message]], *, ext_proc_port: int, admin_port: int = 0
) -> dict[str, Any]:
    """Listeners with inline route configs, EDS clusters turned STATIC with their CLA,
    SDS secrets turned static (a static secret is named without `sds_config`)."""
    routes = {r.name: r for r in resources[ROUTE] if isinstance(r, route_pb2.RouteConfiguration)}
    assignments = {
        a.cluster_name: a
        for a in resources[ENDPOINT]
        if isinstance(a, endpoint_pb2.ClusterLoadAssignment)
    }
    listeners = []
    for resource in resources[LISTENER]:
        assert isinstance(resource, listener_pb2.Listener)
        listener = listener_pb2.Listener()
        listener.CopyFrom(resource)
        for chain in listener.filter_chains:
            for network_filter in chain.filters:
                hcm = hcm_pb2.HttpConnectionManager()
                assert network_filter.typed_config.Unpack(hcm)
                hcm.route_config.CopyFrom(routes[hcm.rds.route_config_name])
                network_filter.typed_config.Pack(hcm)
        listeners.append(to_dict(listener))
    clusters = []
    for resource in resources[CLUSTER]:
        assert isinstance(resource, cluster_pb2.Cluster)
        cluster = cluster_pb2.Cluster()
        cluster.CopyFrom(resource)
        if cluster.type == cluster_pb2.Cluster.EDS:
            cluster.ClearField("eds_cluster_config")
            cluster.type = cluster_pb2.Cluster.STATIC
            cluster.load_assignment.CopyFrom(assignments[cluster.name])
        clusters.append(to_dict(cluster))
    clusters.append(_grpc_cluster(wire.EXT_PROC_CLUSTER, ext_proc_port))
    clusters.append(_grpc_cluster(wire.EXT_PROC_SIDE_CLUSTER, ext_proc_port))
    return {
        "admin": _admin(admin_port),
        "static_resources": {
            "listeners": without_sds_config(listeners),
            "clusters": without_sds_config(clusters),
            "secrets": [to_dict(item) for item in resources.get(SECRET, ())],
        },
    }


def without_sds_config(value: Any) -> Any:
    """A copy with every SdsSecretConfig's `sds_config` dropped: it then names a static secret."""
    if isinstance(value, dict):
        return {key: without_sds_config(item) for key, item in value.items() if key != "sds_config"}
    if isinstance(value, list):
        return [without_sds_config(item) for item in value]
    return value


def ads_bootstrap(resources: Mapping[str, Sequence[Message]]) -> dict[str, Any]:
    """Listeners and clusters exactly as generated, with an ADS source they can name."""
    return {
        "admin": _admin(0),
        "node": {"id": "validate", "cluster": "sluicegate"},
        "dynamic_resources": {
            "ads_config": {
                "api_type": "GRPC",
                "transport_api_version": "V3",
                "grpc_services": [{"envoy_grpc": {"cluster_name": wire.XDS_CLUSTER}}],
            }
        },
        "static_resources": {
            "listeners": [to_dict(item) for item in resources[LISTENER]],
            "clusters": [to_dict(item) for item in resources[CLUSTER]]
            + [
                _grpc_cluster(name, 1)
                for name in (wire.XDS_CLUSTER, wire.EXT_PROC_CLUSTER, wire.EXT_PROC_SIDE_CLUSTER)
            ],
        },
    }


def _admin(port: int) -> dict[str, Any]:
    return {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}


SYSTEM_CA = "/etc/ssl/certs/ca-certificates.crt"


def with_existing_files(value: Any) -> Any:
    """A copy where every `filename` that does not exist here names the system CA bundle.

    Envoy opens data-source files even in validate mode; the fixtures name CA files of an
    imagined deployment.
    """
    if isinstance(value, dict):
        return {
            key: SYSTEM_CA
            if key == "filename" and isinstance(item, str) and not Path(item).exists()
            else with_existing_files(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [with_existing_files(item) for item in value]
    return value


def validate(bootstrap: Mapping[str, Any], tmp: Path) -> subprocess.CompletedProcess[str]:
    """`envoy --mode validate` on the bootstrap; returncode 0 means Envoy accepts it."""
    path = tmp / f"validate-{time.monotonic_ns()}.json"
    path.write_text(json.dumps(with_existing_files(dict(bootstrap)), indent=1))
    return subprocess.run(
        [ENVOY, "--mode", "validate", "-c", str(path), "-l", "warning"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@contextlib.asynccontextmanager
async def running_envoy(bootstrap: Mapping[str, Any], tmp: Path) -> AsyncIterator[Path]:
    """Run Envoy on the bootstrap until its listeners accept; yields the log path."""
    config = tmp / "envoy.json"
    config.write_text(json.dumps(bootstrap, indent=1))
    log = tmp / "envoy.log"
    admin_path = tmp / "admin-address"
    with log.open("wb") as log_file:
        process = await asyncio.create_subprocess_exec(
            ENVOY, "-c", str(config), "--use-dynamic-base-id", "-l", "info",
            "--admin-address-path", str(admin_path), "--disable-hot-restart",
            stdout=log_file, stderr=subprocess.STDOUT, env={**os.environ},
        )  # fmt: skip
        try:
            await _wait_ready(admin_path, process, log)
            yield log
        finally:
            if process.returncode is None:
                process.terminate()
                try:
                    await asyncio.wait_for(process.wait(), 10)
                except TimeoutError:
                    process.kill()
                    await process.wait()


async def _wait_ready(admin_path: Path, process: asyncio.subprocess.Process, log: Path) -> None:
    """Poll the admin /ready endpoint (LIVE once listeners and clusters initialised)."""
    import aiohttp

    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if process.returncode is not None:
                raise RuntimeError(f"envoy exited {process.returncode}:\n{log.read_text()[-4000:]}")
            if admin_path.exists() and admin_path.read_text().strip():
                url = f"http://{admin_path.read_text().strip()}/ready"
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(url) as response:
                        if response.status == 200:
                            return
            await asyncio.sleep(0.05)
    raise RuntimeError(f"envoy not ready in time:\n{log.read_text()[-4000:]}")
