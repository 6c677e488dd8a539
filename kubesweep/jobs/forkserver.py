"""A trial process without the import bill: a fork server for the local backend.

A trial's process spends seconds importing torch, transformers, MLflow and the job before it does anything
(8-15 s on the H100 host of docs/benchmarks.md, bytecode compiled). The server pays that once per sweep
driver: it imports the job's modules, never touches CUDA, and forks one fresh child per trial. Each child is a
process of its own (its own CUDA context, memory, signal handlers, session, exit code), started from the same
pristine parent, so a trial's figures cannot depend on the trial before it (`tests/jobs/test_forkserver.py`
compares a trial run after another through the server with the same trial in a fresh interpreter).

    python -m kubesweep.jobs.forkserver serve SOCKET        # the server (the local backend starts it)
    python -m kubesweep.jobs.forkserver run SOCKET -- ARGS  # one trial: `python -m kubesweep.jobs ARGS`

`run` is the trial's process as the backend sees it: a small client that imports nothing heavy, hands the
server its standard streams, working directory and environment, relays SIGTERM/SIGINT/SIGHUP to the trial and
exits as the trial did (its exit code, or the signal that killed it). When the client is killed outright the
server kills the trial. When the server cannot take the trial — it is not there, or the trial's environment
differs from the server's in a variable read at import time (`IMPORT_ENV_PREFIXES`) — the client runs the
job itself, in place (exec), and says so on its standard error.

A trial is taken by a *spare*: a child forked from the server ahead of the request, which waits for it. It is
forked from the same pristine server as the trial before it; once it takes a trial the server forks the next one.

On a machine with an NVIDIA GPU the spare also prepares for its trial while the trial before it runs: it starts
Inductor's compile workers (at a lower CPU priority than the running trial) and imports the compiler's modules
that a trial's first compilation would import (`WARM_IMPORTS`). Importing those asks CUDA for its devices, which
fixes the devices the process sees, so the spare prepares for one CUDA environment (`CUDA_*`: the last trial's;
at first the server's) and takes only a trial with that environment; any other trial is taken by a spare forked
for it on the spot, which prepares nothing. Whichever spare takes it, a trial starts from the same state for the
same request. On the H100 of docs/benchmarks.md this took a
bert-base trial from 18.3 s to 14.6 s and its warm-up from an empty compile cache from 16.8 s to 12.5-15.0 s.
`KUBESWEEP_FORKSERVER_WARM=0` turns it off.

The server stops when its standard input closes (the backend that started it has exited) once the trials it
forked have ended; it takes no new ones meanwhile. SIGTERM ends it at once, also while it imports: its spare and
any trial it forked are killed, its socket removed. The backend sends it when the sweep ends or is cancelled
(`Handle.terminate`, or `end_recorded` from another process, which finds the server in the record file the
handle keeps).

Its parts: forkserver_server (the server's loop), forkserver_client (`run`), forkserver_protocol (the messages
between them and the environment rules), forkserver_warm (preloading and preparing), forkserver_child (a spare
becoming its trial) and forkserver_handle (starting and ending a server from the backend).
"""

from __future__ import annotations

import sys

from kubesweep.jobs.forkserver_client import run
from kubesweep.jobs.forkserver_server import serve


def main(args: list[str] | None = None) -> int:
    args = sys.argv[1:] if args is None else args
    if len(args) == 2 and args[0] == "serve":
        return serve(args[1])
    if len(args) >= 3 and args[0] == "run" and args[2] == "--":
        return run(args[1], args[3:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
