"""sluicegate.envoy: the bootstrap an Envoy needs to follow sluicegate, and a launcher.

bootstrap = make_bootstrap(node_id="gw", cluster="sluicegate",
                           xds_address="127.0.0.1:18000",
                           ext_proc_address="127.0.0.1:18001",
                           admin_address="127.0.0.1:9901", ads_mode="sotw")
envoy = EnvoyProcess(bootstrap, concurrency=2)
await envoy.start()          # until /ready says LIVE
envoy.stats(); envoy.config_dump()
await envoy.stop()
"""

from .admin import AdminError, admin_base_url, admin_get, admin_json, flatten_stats
from .bootstrap import (
    AdsMode,
    bootstrap_dict,
    bootstrap_json,
    bootstrap_yaml,
    declared_native_module,
    make_bootstrap,
)
from .launcher import EnvoyProcess, EnvoyStartError, find_envoy_binary

__all__ = [
    "AdminError",
    "AdsMode",
    "EnvoyProcess",
    "EnvoyStartError",
    "admin_base_url",
    "admin_get",
    "admin_json",
    "bootstrap_dict",
    "bootstrap_json",
    "bootstrap_yaml",
    "declared_native_module",
    "find_envoy_binary",
    "flatten_stats",
    "make_bootstrap",
]
