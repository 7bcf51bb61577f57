"""Distinct OpenAI-style errors for each way a provider attempt can fail inside Envoy.

Envoy answers these itself (local replies); the listener's local_reply_config
(listeners.py) rewrites each into `{"error": {"message", "type", "param", "code"}}` with the
`code` below, chosen by the reply's response code details (what Envoy's access logs show
as %RESPONSE_CODE_DETAILS%) or its response flags. The rows live in
sluicegate.local_replies, where the request record (sluicegate.records) reads the same
ones back to name the code a client got. Checked on Envoy 1.40 (see the experiments
summarised in timeouts.py and tests/resilience):

| Envoy's reply                                   | status | code                       |
|-------------------------------------------------|--------|----------------------------|
| details `ext_proc_error_gRPC_error_14{…}`, or a  | 503    | `ext_proc_unavailable`     |
| reset of the ext_proc stream (no server reached) |        |                            |
| details `upstream_per_try_timeout`              | 504    | `upstream_timeout`         |
| details `upstream_per_try_idle_timeout`         | 504    | `upstream_idle_timeout`    |
| details `response_timeout` (route timeout)      | 504    | `deadline_exceeded`        |
| details `stream_idle_timeout` (listener's 5 min)| 504    | `stream_idle_timeout`      |
| details `…{connection_timeout}` (flag UF)       | 503    | `upstream_connect_timeout` |
| flag UO (a pool limit)                          | 503    | `upstream_overflow`        |
| flag UH (every provider ejected or unhealthy)   | 503    | `no_healthy_upstream`      |
| flag UF (refused, TLS failure)                  | 503    | `upstream_connect_error`   |
| flags UC, UR (dropped before answering)         | 503    | `upstream_reset`           |

Retries exhausted on a provider's own answer (429, 503 …) are not local replies: the
client gets the last provider answer unchanged (its OpenAI error and Retry-After).
Once a response has started nothing can be rewritten: Envoy resets the stream (see the
docs/resilience.md, "What the client sees when a started stream fails").
"""

from sluicegate.local_replies import UPSTREAM_ERRORS as UPSTREAM_ERRORS
from sluicegate.local_replies import UpstreamError as UpstreamError
