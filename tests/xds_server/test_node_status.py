"""What the ADS server says of a node across connections (status.py)."""

from __future__ import annotations

from sluicegate.xds.server.status import AdsStatus, NackRecord

LISTENER = "type.googleapis.com/envoy.config.listener.v3.Listener"


def test_a_new_connection_starts_without_the_last_ones_acks() -> None:
    """An Envoy that `sluicegate up` restarted holds nothing: showing the dead process's
    ACKed versions hid that the new one rejected the same listener (it had none)."""
    status = AdsStatus()
    node = status.connect("gw", "sluicegate", "sotw")
    status.sent(node, LISTENER, "v1")
    status.acked(node, LISTENER, "v1")
    status.nacked(node, LISTENER, NackRecord("v2", "bad module", 1.0, "n2"))
    status.disconnect(node)
    again = status.connect("gw", "sluicegate", "sotw")
    assert again.acked_versions() == {}
    assert again.current_nacks() == {}
    assert again.to_dict()["sent"] == {}
    # The history of rejections stays, for `sluicegate status`'s last NACK.
    assert again.to_dict()["last_nacks"][LISTENER]["message"] == "bad module"


def test_a_second_stream_of_a_connected_node_keeps_its_state() -> None:
    status = AdsStatus()
    node = status.connect("gw", "sluicegate", "sotw")
    status.acked(node, LISTENER, "v1")
    status.connect("gw", "sluicegate", "sotw")
    assert node.acked_versions() == {LISTENER: "v1"}
