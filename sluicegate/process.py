"""Child processes that die with their parent, without a fork-time Python hook.

`up` starts Envoy and the mock providers as children; each must get SIGTERM if
sluicegate dies, even by SIGKILL (Linux's PR_SET_PDEATHSIG). Setting that from
a `preexec_fn` forces a plain fork() that runs gRPC's fork handlers while the
gRPC servers are live; Envoy then sometimes aborted at start ("epoll_wait:
Bad file descriptor", 2-3 starts in 12). util-linux's `setpriv --pdeathsig`
sets the same flag in the child instead, and Python keeps its fast,
hook-free spawn path.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence

_SETPRIV = shutil.which("setpriv") if sys.platform.startswith("linux") else None


def die_with_parent(argv: Sequence[str]) -> list[str]:
    """argv, run so that it receives SIGTERM when the process that started it exits.

    Where setpriv is missing (not Linux), argv is returned unchanged and the caller's
    own stop() remains the only guarantee.
    """
    if _SETPRIV is None:
        return list(argv)
    return [_SETPRIV, "--pdeathsig", "TERM", "--", *argv]
