"""A multi-node trial's launch: pod 0 of its Indexed Job hosts torchrun's rendezvous store, said by its index.

torchrun's c10d rendezvous decides whether this process hosts the store by resolving the endpoint's name and
comparing it with its own addresses. In a pod that starts before its name is in the cluster's DNS (the
EndpointSlice and the DNS server's watch follow the pod's start by a second or more), the name does not resolve,
pod 0 decides it is not the host, and every pod then waits for a store nobody serves. The Job's completion index
(`JOB_COMPLETION_INDEX`, set by the Job controller) says it without DNS: index 0 hosts, the others connect (and
retry while the name propagates). Outside an Indexed Job, torchrun decides as it would.

    python -m kubesweep.jobs.rendezvous TORCHRUN_ARGS...   # exec's torch.distributed.run with is_host set
"""

from __future__ import annotations

import os
import sys

INDEX_ENV = "JOB_COMPLETION_INDEX"


def torchrun_argv(args: list[str], index: str | None, python: str = sys.executable) -> list[str]:
    """torchrun's command line for the pod of completion `index` (None: not an Indexed Job's pod)."""
    host = [] if index is None else [f"--rdzv_conf=is_host={1 if index.strip() == '0' else 0}"]
    return [python, "-m", "torch.distributed.run", *host, *args]


def main() -> None:
    argv = torchrun_argv(sys.argv[1:], os.environ.get(INDEX_ENV))
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main()
