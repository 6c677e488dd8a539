"""A warm trial pod: one GPU slot of one sweep, running that sweep's trials one after another.

    python -m kubesweep.jobs.worker --handover /etc/kubesweep/handover.json --output-dir /workspace/output

A pod per trial pays its start-up every time: the pod itself, the interpreter's imports, and the trial's compile
cache from empty. The worker pays the first two once: it starts the fork server (kubesweep/jobs/forkserver.py),
which imports the job without touching CUDA, and runs each trial handed to it as a child forked from that server.
Each trial is still a process of its own, started from the same pristine parent, so a trial's CUDA state, an OOM,
a crash or a hang end with it, and its figures and warm-up are its own. The compile caches (`TORCHINDUCTOR_CACHE_DIR`,
`TRITON_CACHE_DIR`) are the pod's, so a trial after another of the same shapes compiles from the cache. A trial of
more than one GPU runs under torchrun, a fresh process group per trial.

What to run comes from the hand-over file (`kubesweep.wire.handover`): the driver writes it into the pod's
annotation, the kubelet into the file. The worker runs the listed trials in order, each once in this pod; stops
the running trial (SIGTERM, then SIGKILL after `--grace` seconds) when it is taken out of the list; and ends when
the list is `closed` and run, or when nothing has been handed over for `--idle-timeout` seconds (a driver that is
gone never keeps a GPU held). A trial of another sweep, or whose config names another trial, is refused (an `end`
event with exit code 2), never run.

It says what happens as event lines on its standard output, the pod's log; a trial's own output passes through it
to the same log (split into lines at `\n` alone, as the driver reads the log, and any line holding the event
prefix escaped, so no trial can write an event) and to `OUTPUT/<trial>/log.txt`. The
worker makes itself non-dumpable, so a trial, which runs as the same user, cannot reach the worker's standard
output through /proc and write there unescaped. SIGTERM (the pod deleted, evicted or preempted) is passed to the
running trial, which records itself cancelled and keeps its checkpoint, and ends the worker once the trial has
ended; the trials it had not started are the driver's to hand over again.

Each trial gets, beside the pod's environment: `KUBESWEEP_TRIAL_ID`, its checkpoint directory
`$KUBESWEEP_CHECKPOINT_ROOT/<sweep>/<trial>` when the pod has a checkpoint claim, and its output directory
`OUTPUT/<trial>`. `KUBESWEEP_QUEUED_AT` (the pod's Kueue wait) reaches the first trial only.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from kubesweep.jobs.command import (
    CHECKPOINT_DIR_ENV,
    CHECKPOINT_ROOT_ENV,
    JOB_MODULE,
    QUEUED_AT_ENV,
    SWEEP_ENV,
    TRIAL_ID_ENV,
    job_argv,
)
from kubesweep.jobs.forkserver_handle import Handle
from kubesweep.wire.handover import LINE_END, Handover, WorkerEvent, escape, read_handover, split_lines
from kubesweep.wire.outcomes import ExitCode, outcome_for_exit

DEFAULT_IDLE_TIMEOUT_S = 300.0
DEFAULT_GRACE_S = 30.0  # a pod's default terminationGracePeriodSeconds
DEFAULT_POLL_S = 0.25
PR_SET_DUMPABLE = 4
RELAY_CHUNK = 65536  # bytes of a trial's output read at once
_OUT_LOCK = threading.Lock()  # one writer of the pod's log at a time: events and the relayed lines stay whole


@dataclass
class Running:
    """The trial the worker runs now."""

    trial: str
    proc: subprocess.Popen[bytes]
    relay: threading.Thread
    stop_reason: str | None = None
    stop_sent: float | None = None


@dataclass
class Worker:
    handover: Path
    output: Path
    sweep: str
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT_S
    grace: float = DEFAULT_GRACE_S
    poll: float = DEFAULT_POLL_S
    python: str = sys.executable
    forkserver: bool = True
    ran: set[tuple[str, int]] = field(default_factory=set)  # (trial, attempt) started in this pod, each once
    running: Running | None = None
    terminating: bool = False
    _server: Handle | None = None
    _bad_handover: str | None = None
    _queued_at_used: bool = False
    work: Path = field(init=False)  # where the handed trials' config files are written

    def __post_init__(self) -> None:
        self.work = Path(tempfile.mkdtemp(prefix="kubesweep-worker-"))

    # -- the loop -----------------------------------------------------------------------------------------

    def serve(self) -> int:
        """Run what is handed over until closed, idle or terminated; returns the worker's exit code."""
        self.output.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        if self.forkserver:
            self._server = Handle(self.python, env, self.output / "forkserver.log")
        self.event(WorkerEvent("ready", time.time(), reason=f"sweep {self.sweep}"))
        idle_since = time.monotonic()
        try:
            while True:
                handed = self._read()
                if self.running is not None:
                    self._follow(handed)
                    idle_since = time.monotonic()
                    continue
                if self.terminating:
                    return self._exit(128 + signal.SIGTERM, "terminated")
                nxt = self._next(handed)
                if nxt is not None:
                    self._start(*nxt)
                    continue
                if handed is not None and handed.closed:
                    return self._exit(0, "closed: every trial handed over has run")
                if time.monotonic() - idle_since > self.idle_timeout:
                    return self._exit(0, f"idle: nothing handed over for {self.idle_timeout:g} s")
                time.sleep(self.poll)
        finally:
            if self._server is not None:
                self._server.terminate()
            shutil.rmtree(self.work, ignore_errors=True)

    def terminate(self) -> None:
        """SIGTERM: stop the running trial (it keeps its checkpoint) and end once it has ended."""
        self.terminating = True
        running = self.running
        if running is not None and running.stop_sent is None:
            running.stop_reason = "the pod is terminating"
            self._signal(running, signal.SIGTERM)

    # -- the hand-over ------------------------------------------------------------------------------------

    def _read(self) -> Handover | None:
        """The hand-over as the file says now; a file that is not one is said once, and read as nothing new."""
        try:
            text = self.handover.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._say_bad(f"cannot read {self.handover}: {exc.strerror}")
            return None
        try:
            handed = read_handover(text)
        except ValueError as exc:
            self._say_bad(f"{self.handover}: not a hand-over: {exc}")
            return None
        self._bad_handover = None
        return handed

    def _say_bad(self, problem: str) -> None:
        if problem != self._bad_handover:
            self._bad_handover = problem
            print(f"worker: {problem}", file=sys.stderr, flush=True)

    def _next(self, handed: Handover | None) -> tuple[str, int, dict[str, Any]] | None:
        if handed is None:
            return None
        for entry in handed.trials:
            if (entry.id, entry.attempt) not in self.ran:
                return entry.id, entry.attempt, entry.config
        return None

    # -- one trial ----------------------------------------------------------------------------------------

    def _start(self, trial: str, attempt: int, config: dict[str, Any]) -> None:
        self.ran.add((trial, attempt))
        problem = self._refusal(trial, config)
        if problem is not None:
            now = time.time()
            self.event(WorkerEvent("start", now, trial=trial))
            print(f"worker: trial {trial} refused: {problem}", flush=True)
            self.event(WorkerEvent("end", now, trial=trial, exit_code=int(ExitCode.USAGE), outcome="failed",
                                   reason=problem))
            return
        out = self.output / trial
        out.mkdir(parents=True, exist_ok=True)
        config_path = self.work / f"{trial}.json"
        config_path.write_text(json.dumps(config, sort_keys=True), encoding="utf-8")
        env = self._trial_env(trial)
        gpus = int(config.get("gpus_per_trial") or 0)
        argv = job_argv(str(config_path), str(out), python=self.python, gpus=max(gpus, 1))
        if self._server is not None and argv[1:3] == ["-m", JOB_MODULE]:
            argv = self._server.argv(argv[3:])  # one GPU or none: forked from the warm server
        self.event(WorkerEvent("start", time.time(), trial=trial))
        log = (out / "log.txt").open("ab")
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                bufsize=0)  # unbuffered: a read returns what has come (`_relay`)
        assert proc.stdout is not None
        relay = threading.Thread(target=_relay, args=(proc.stdout, log), daemon=True, name=f"relay-{trial}")
        relay.start()
        self.running = Running(trial, proc, relay)
        if self.terminating:  # SIGTERM came while it started
            self.terminate()

    def _refusal(self, trial: str, config: dict[str, Any]) -> str | None:
        if config.get("sweep") != self.sweep:
            return f"its config is of sweep {str(config.get('sweep'))[:80]!r}, this pod runs sweep {self.sweep!r}"
        if config.get("trial_id") != trial:
            return f"its config names trial {str(config.get('trial_id'))[:80]!r}"
        return None

    def _trial_env(self, trial: str) -> dict[str, str]:
        env = dict(os.environ)
        env[TRIAL_ID_ENV] = trial
        env.pop(CHECKPOINT_DIR_ENV, None)
        root = env.get(CHECKPOINT_ROOT_ENV)
        if root:
            env[CHECKPOINT_DIR_ENV] = f"{root.rstrip('/')}/{self.sweep}/{trial}"
        if self._queued_at_used:
            env.pop(QUEUED_AT_ENV, None)  # the pod's wait for admission was the first trial's
        self._queued_at_used = True
        return env

    def _follow(self, handed: Handover | None) -> None:
        """Wait a poll for the running trial; stop it when it left the hand-over; record its end."""
        running = self.running
        assert running is not None
        try:
            code = running.proc.wait(timeout=self.poll)
        except subprocess.TimeoutExpired:
            listed = handed is None or any(t.id == running.trial for t in handed.trials)
            if not listed and running.stop_sent is None:
                running.stop_reason = "taken out of the hand-over"
                self._signal(running, signal.SIGTERM)
            elif running.stop_sent is not None and time.monotonic() - running.stop_sent > self.grace:
                self._signal(running, signal.SIGKILL)
            return
        running.relay.join(timeout=10)
        code = 128 - code if code < 0 else code  # killed by a signal: as a shell reports it
        self.running = None
        self.event(WorkerEvent("end", time.time(), trial=running.trial, exit_code=code,
                               outcome=self._outcome(running.trial, code), reason=running.stop_reason))

    def _outcome(self, trial: str, code: int) -> str:
        """What the trial's results file says it ended as; its exit code's meaning without one."""
        with contextlib.suppress(OSError, ValueError, AttributeError):
            outcome = json.loads((self.output / trial / "results.json").read_text()).get("outcome")
            if isinstance(outcome, str) and outcome.isidentifier():
                return outcome
        return outcome_for_exit(code).value

    def _signal(self, running: Running, sig: signal.Signals) -> None:
        """Signal the trial's launcher (the fork server's client, which passes it on; torchrun); a SIGKILL goes to
        its whole process group."""
        if running.stop_sent is None:
            running.stop_sent = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            if sig == signal.SIGKILL:
                os.killpg(running.proc.pid, sig)
            else:
                running.proc.send_signal(sig)

    # -- saying it ----------------------------------------------------------------------------------------

    def event(self, event: WorkerEvent) -> None:
        with _OUT_LOCK:
            sys.stdout.write(event.line() + LINE_END)
            sys.stdout.flush()

    def _exit(self, code: int, reason: str) -> int:
        self.event(WorkerEvent("exit", time.time(), reason=reason))
        return code


def _relay(stream: IO[bytes], log: IO[bytes]) -> None:
    """A trial's output as it comes to its log file, and line by line, escaped, to the worker's standard output:
    split at `LINE_END` alone (`split_lines`), as the driver splits the pod's log, so that no character of a line
    (a carriage return, U+2028, ...) starts another there. `stream` is unbuffered: a read returns what has come."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    rest = ""
    with log, stream:
        while True:
            raw = stream.read(RELAY_CHUNK)
            if raw:
                log.write(raw)
                log.flush()
            lines, rest = split_lines(rest + decoder.decode(raw or b"", final=not raw))
            if not raw and rest:  # the output ended inside a line
                lines, rest = [*lines, rest], ""
            with _OUT_LOCK:
                sys.stdout.write("".join(escape(line) + LINE_END for line in lines))
                sys.stdout.flush()
            if not raw:
                return


def _undumpable() -> None:
    """Make this process non-dumpable: /proc/<pid>/fd then belongs to root, so a trial of the same user cannot
    open the worker's standard output there. Its children are dumpable again once they exec."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m kubesweep.jobs.worker",
                                     description="Run one sweep's trials one after another in a warm pod, as its "
                                                 "hand-over file lists them.")
    parser.add_argument("--handover", type=Path, default=Path("/etc/kubesweep/handover.json"),
                        help="the hand-over file (the pod annotation through the downward API)")
    parser.add_argument("--output-dir", type=Path, default=Path(os.environ.get("KUBESWEEP_OUTPUT_DIR", "output")),
                        help="each trial's output goes to OUTPUT_DIR/<trial> (default $KUBESWEEP_OUTPUT_DIR)")
    parser.add_argument("--sweep", default=os.environ.get(SWEEP_ENV),
                        help="the one sweep whose trials this pod runs (default $KUBESWEEP_SWEEP)")
    parser.add_argument("--idle-timeout", type=float, default=DEFAULT_IDLE_TIMEOUT_S,
                        help="end after this many seconds with nothing handed over (default %(default)s)")
    parser.add_argument("--grace", type=float, default=DEFAULT_GRACE_S,
                        help="seconds a stopped trial has after SIGTERM before SIGKILL (default %(default)s)")
    parser.add_argument("--no-forkserver", action="store_true",
                        help="start each trial as a fresh interpreter instead of forking it from the warm server")
    args = parser.parse_args(argv)
    if not args.sweep:
        parser.error("--sweep (or $KUBESWEEP_SWEEP) is required")
    if args.idle_timeout <= 0 or args.grace < 0:
        parser.error("--idle-timeout must be > 0 and --grace >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _undumpable()
    worker = Worker(args.handover, args.output_dir, args.sweep, idle_timeout=args.idle_timeout, grace=args.grace,
                    forkserver=not args.no_forkserver)
    signal.signal(signal.SIGTERM, lambda signum, frame: worker.terminate())
    return worker.serve()


if __name__ == "__main__":
    sys.exit(main())
