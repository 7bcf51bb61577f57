"""Failover drills: Envoy's fault filter, configured per route.

The filter sits in every listener after the ext_proc filter, so it sees the
route that the model header selected, and does nothing on routes without a
`fault:` setting. Keeping it always present means turning a drill on or off
changes only the RouteConfiguration, never the Listener (which would drain
connections).
"""

from __future__ import annotations

from envoy.extensions.filters.common.fault.v3 import fault_pb2 as common_fault_pb2
from envoy.extensions.filters.http.fault.v3 import fault_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.type.v3 import percent_pb2

from sluicegate.config import Fault

from ._proto import duration_ms, pack

FAULT_FILTER = "envoy.filters.http.fault"


def fault_http_filter() -> hcm_pb2.HttpFilter:
    """The listener's filter: inert until a route configures a drill."""
    return hcm_pb2.HttpFilter(name=FAULT_FILTER, typed_config=pack(fault_pb2.HTTPFault()))


def _share(percent: float) -> percent_pb2.FractionalPercent:
    # Per million, so 0.1% drills are exact.
    return percent_pb2.FractionalPercent(
        numerator=round(percent * 10_000), denominator=percent_pb2.FractionalPercent.MILLION
    )


def route_fault(fault: Fault) -> fault_pb2.HTTPFault:
    """The per-route HTTPFault for a drill."""
    config = fault_pb2.HTTPFault()
    if fault.delay is not None:
        config.delay.CopyFrom(
            common_fault_pb2.FaultDelay(
                fixed_delay=duration_ms(fault.delay.duration),
                percentage=_share(fault.delay.percent),
            )
        )
    if fault.abort is not None:
        config.abort.CopyFrom(
            fault_pb2.FaultAbort(
                http_status=fault.abort.status, percentage=_share(fault.abort.percent)
            )
        )
    return config
