"""The peers of the comparison suite (issue 11, part 2): every gateway compared, installed,
configured with the same route to one upstream, started, probed and stopped from Python,
each isolated.

- `peer`: the interface: `Upstream` (a URL and a model), `Peer` (`install()`,
  `version()`, `start(upstream)`, and `does`: what it does per request), `RunningPeer`
  (`url`, `model`, `headers`, `pids()` of its whole process tree, `stop()`);
- one module a peer: `direct`, `plain_envoy`, `sluicegate_stack` (routing and
  admission, on the documents of `documents`), `litellm_proxy` (1 and N workers),
  `portkey_gateway`; `catalog.peers()` makes them all;
- `processes`: process trees, their RSS, readiness and idleness, stopping a tree;
- `locks/`: the pinned versions of the peers installed outside the project's venv,
  under `<repo>/.bench-peers/` (gitignored);
- `smoke`: `python -m benchmarks.peers.smoke [--only NAME ...]` installs, starts, probes
  and stops each peer against one mock provider.
"""

from .catalog import cores, peers
from .peer import CACHE, Peer, RunningPeer, Upstream

__all__ = ["CACHE", "Peer", "RunningPeer", "Upstream", "cores", "peers"]
