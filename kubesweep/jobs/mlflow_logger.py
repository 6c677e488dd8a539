"""Buffered, retrying MLflow logging for one trial: training never waits on, or dies of, the tracking server.

Every call (`log_metrics`, `log_params`, `set_tags`, `log_artifact`) only appends to an in-memory queue; one
background thread sends it: consecutive metrics go in `log_batch` calls of up to 1,000, params and tags in
batches of 100. When the server is unreachable the thread backs off (0.5 s doubling to 10 s) and retries the
same request, so nothing is dropped or reordered; `close()` waits for the queue to drain (up to
`KUBESWEEP_MLFLOW_FLUSH_TIMEOUT_S`, default 300 s) and writes whatever is still unsent to a spool file (JSON
lines) rather than lose it. The trial's next attempt in the same output directory sends a spool it finds
there first, into the same run, before anything of its own (the earlier attempt's end-of-run status is left
out: the new attempt ends the run itself); the spool is renamed `*.replaying` while that happens, and removed
once everything is sent. Requests the server rejects as invalid (e.g. a param changed on a re-run) are
logged and skipped; they would never succeed.

Every step once: beside the spool, `mlflow-steps.json` records, per metric, the last step sent into the run. A
later attempt of the trial (a pod that replaced an evicted one, resuming from a checkpoint) sends a metric value
only for steps after the ones earlier attempts sent, so steps it trains again are not logged twice. The spool
and this record live wherever the trial keeps its state: the checkpoint directory when the trial has one (on
Kubernetes, the checkpoint claim), else the output directory.

The run: one child run per trial under the sweep's parent run (tag `mlflow.parentRunId`), found again by the
tags `kubesweep.trial_id` and `mlflow.parentRunId` when a trial is re-run, so a retried trial never makes a
duplicate, and never logs into the run of a sweep made before under its name. `MLFLOW_RUN_ID`
is not used. Environment:
- `MLFLOW_TRACKING_URI`: the server; without it tracking is off (said once);
- `KUBESWEEP_EXPERIMENT`: experiment name (default `kubesweep`; the parent run's experiment wins);
- `KUBESWEEP_PARENT_RUN_ID`: the sweep's run;
- `KUBESWEEP_TRIAL_ID`: the trial's id (default: the trial config's).
The requests go through `mlflow_client`: MLflow's REST API for an http(s) server (no mlflow package needed),
mlflow's own client for any other store (imported in the sender thread). Importing this module needs only the
standard library.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubesweep.jobs.mlflow_client import (
    ARTIFACTS_ELSEWHERE,
    REDIRECTED,
    TOO_LARGE,
    MetricRecord,
    TrackingClient,
    client_for,
)
from kubesweep.wire import tags

log = logging.getLogger(__name__)

DEFAULT_EXPERIMENT = "kubesweep"
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_PER_BATCH = 100
MAX_PARAM_LENGTH = 6000
# Error codes meaning "this request is wrong", not "the server is away": retrying cannot help.
PERMANENT_ERRORS = frozenset(
    {
        "INVALID_PARAMETER_VALUE",
        "RESOURCE_ALREADY_EXISTS",
        "RESOURCE_DOES_NOT_EXIST",
        "BAD_REQUEST",
        "INVALID_STATE",
        "PERMISSION_DENIED",
        "UNAUTHENTICATED",
        REDIRECTED,
        TOO_LARGE,
        ARTIFACTS_ELSEWHERE,
    }
)


@dataclass
class _Op:
    kind: str  # metrics | params | tags | artifact | terminate
    payload: Any


@dataclass
class LoggerStats:
    sent_requests: int = 0
    sent_metrics: int = 0
    retries: int = 0
    dropped: int = 0
    pending: int = 0
    run_id: str | None = None
    spool: str | None = None


def _experiment_id(client: TrackingClient, name: str) -> str:
    """The experiment `name`, made when missing; one another trial made between the read and the create (two
    trials starting at once with no parent run) is used, not refused."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    try:
        return str(client.create_experiment(name))
    except Exception:
        raced = client.get_experiment_by_name(name)
        if raced is None:
            raise
        return str(raced.experiment_id)


class NullLogger:
    """Tracking off: same interface, does nothing."""

    enabled = False
    run_id: str | None = None

    def prior_step(self, prefix: str) -> int:
        return 0

    def log_metrics(self, metrics: dict[str, float], step: int, timestamp_ms: int | None = None) -> None:
        pass

    def log_params(self, params: dict[str, Any]) -> None:
        pass

    def set_tags(self, tags: dict[str, Any]) -> None:
        pass

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        pass

    def close(self, status: str | None = "FINISHED") -> LoggerStats:
        return LoggerStats()


@dataclass
class MlflowTrialLogger:
    uri: str
    trial_id: str
    run_name: str
    experiment: str = DEFAULT_EXPERIMENT
    parent_run_id: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    spool_path: Path | None = None
    flush_timeout_s: float = 300.0
    backoff_max_s: float = 10.0
    enabled = True
    run_id: str | None = None
    stats: LoggerStats = field(default_factory=LoggerStats)
    _queue: deque[_Op] = field(default_factory=deque)
    _lock: threading.Condition = field(default_factory=threading.Condition)
    _closing: bool = False
    _thread: threading.Thread | None = None
    _client: TrackingClient | None = None
    _replaying: Path | None = None
    _prior_steps: dict[str, int] = field(default_factory=dict)  # sent by earlier attempts into _prior_run
    _prior_run: str | None = None
    _sent_steps: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_env(
        cls, trial_id: str, run_name: str, tags: dict[str, str], spool_path: Path | None
    ) -> MlflowTrialLogger | NullLogger:
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            print("tracking: off (MLFLOW_TRACKING_URI is not set)", flush=True)
            return NullLogger()
        if not uri.startswith(("http://", "https://")) and importlib.util.find_spec("mlflow") is None:
            print(f"tracking: off (MLFLOW_TRACKING_URI is {uri}, but mlflow is not installed: "
                  "pip install 'kubesweep[tracking]')", flush=True)
            return NullLogger()
        logger = cls(
            uri=uri,
            trial_id=os.environ.get("KUBESWEEP_TRIAL_ID") or trial_id,
            run_name=run_name,
            experiment=os.environ.get("KUBESWEEP_EXPERIMENT") or DEFAULT_EXPERIMENT,
            parent_run_id=os.environ.get("KUBESWEEP_PARENT_RUN_ID") or None,
            tags=tags,
            spool_path=spool_path,
            flush_timeout_s=float(os.environ.get("KUBESWEEP_MLFLOW_FLUSH_TIMEOUT_S", "300")),
        )
        logger.start()
        print(
            f"tracking: MLflow at {uri}, experiment {logger.experiment}, trial {logger.trial_id}", flush=True
        )
        return logger

    # ------------------------------------------------------------------------------------------ public API

    def start(self) -> None:
        # our own retry loop replaces mlflow's long blocking retries; a request fails fast and is retried here
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
        self._load_steps()
        self._queue.extendleft(reversed(self._take_spool()))
        self._thread = threading.Thread(target=self._run, name="mlflow-logger", daemon=True)
        self._thread.start()

    def prior_step(self, prefix: str) -> int:
        """The last step earlier attempts of this trial sent for metrics named `prefix...` (0: none)."""
        return max((v for k, v in self._prior_steps.items() if k.startswith(prefix)), default=0)

    def log_metrics(self, metrics: dict[str, float], step: int, timestamp_ms: int | None = None) -> None:
        ts = timestamp_ms if timestamp_ms is not None else int(time.time() * 1000)
        self._put(_Op("metrics", [(k, float(v), ts, int(step)) for k, v in metrics.items()]))

    def log_params(self, params: dict[str, Any]) -> None:
        items = [(k, str(v)[:MAX_PARAM_LENGTH]) for k, v in params.items()]
        for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
            self._put(_Op("params", items[i : i + MAX_PARAMS_PER_BATCH]))

    def set_tags(self, tags: dict[str, Any]) -> None:
        items = [(k, str(v)) for k, v in tags.items()]
        for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
            self._put(_Op("tags", items[i : i + MAX_PARAMS_PER_BATCH]))

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self._put(_Op("artifact", (str(path), artifact_path)))

    def close(self, status: str | None = "FINISHED") -> LoggerStats:
        """Mark the run ended with `status` (None: leave it running), wait for everything to be sent (bounded),
        spool the rest."""
        if status is not None:
            self._put(_Op("terminate", status))
        deadline = time.monotonic() + self.flush_timeout_s
        with self._lock:
            self._closing = True
            self._lock.notify_all()
            while self._queue and time.monotonic() < deadline:
                self._lock.wait(timeout=0.5)
            left = list(self._queue)
        self.stats.pending = len(left)
        if left:
            self._spool(left)  # the replayed requests still unsent are among them
        if self._replaying is not None:
            self._replaying.unlink(missing_ok=True)
        print(
            f"tracking: {self.stats.sent_requests} requests, {self.stats.sent_metrics} metric values sent, "
            f"{self.stats.retries} retries, {self.stats.pending} pending, run {self.run_id}",
            flush=True,
        )
        return self.stats

    # -------------------------------------------------------------------------------------------- sender

    def _put(self, op: _Op) -> None:
        with self._lock:
            self._queue.append(op)
            self._lock.notify_all()

    def _run(self) -> None:
        backoff = 0.5
        while True:
            with self._lock:
                while not self._queue:
                    self._lock.wait()
                batch = self._take()
            try:
                self._send(batch)
            except Exception as err:
                if _permanent(err) and self.run_id is None:
                    log.error("tracking: cannot open the trial's MLflow run, tracking off: %s", _brief(err))
                    with self._lock:
                        self.stats.dropped += len(self._queue)
                        self._queue.clear()
                        self._lock.notify_all()
                    return
                if _permanent(err):
                    log.warning(
                        "tracking: MLflow rejected a %s request, skipped: %s", batch[0].kind, _brief(err)
                    )
                    self.stats.dropped += 1
                else:
                    self.stats.retries += 1
                    if self.stats.retries == 1 or self.stats.retries % 20 == 0:
                        log.warning("tracking: MLflow unreachable (%s); buffering and retrying", _brief(err))
                    time.sleep(backoff)
                    backoff = min(backoff * 2, self.backoff_max_s)
                    continue
            backoff = 0.5
            with self._lock:
                for _ in batch:
                    self._queue.popleft()
                self._lock.notify_all()
                if batch[-1].kind == "terminate" and not self._queue:
                    return

    def _take(self) -> list[_Op]:
        """The head of the queue, merging consecutive metric ops up to one log_batch (queue left intact)."""
        first = self._queue[0]
        if first.kind != "metrics":
            return [first]
        batch: list[_Op] = []
        count = 0
        for op in self._queue:
            if op.kind != "metrics" or (batch and count + len(op.payload) > MAX_METRICS_PER_BATCH):
                break
            batch.append(op)
            count += len(op.payload)
        return batch

    def _send(self, batch: list[_Op]) -> None:
        client = self._ensure_run()
        assert self.run_id is not None
        kind = batch[0].kind
        if kind == "metrics":
            prior = self._prior_steps if self._prior_run == self.run_id else {}
            metrics = [MetricRecord(k, v, ts, step) for op in batch for (k, v, ts, step) in op.payload
                       if step > prior.get(k, -1)]
            for i in range(0, len(metrics), MAX_METRICS_PER_BATCH):
                client.log_batch(self.run_id, metrics=metrics[i : i + MAX_METRICS_PER_BATCH])
            self.stats.sent_metrics += len(metrics)
            self._record_steps(metrics)
        elif kind == "params":
            client.log_batch(self.run_id, params=[(k, v) for k, v in batch[0].payload])
        elif kind == "tags":
            client.log_batch(self.run_id, tags=[(k, v) for k, v in batch[0].payload])
        elif kind == "artifact":
            path, artifact_path = batch[0].payload
            if Path(path).is_dir():
                client.log_artifacts(self.run_id, path, artifact_path)
            elif Path(path).exists():
                client.log_artifact(self.run_id, path, artifact_path)
        elif kind == "terminate":
            client.set_terminated(self.run_id, status=batch[0].payload)
        self.stats.sent_requests += 1

    def _ensure_run(self) -> TrackingClient:
        if self._client is None:
            self._client = client_for(self.uri)
        if self.run_id is not None:
            return self._client
        client = self._client
        if self.parent_run_id:
            experiment_id = client.get_run(self.parent_run_id).info.experiment_id
        else:
            experiment_id = _experiment_id(client, self.experiment)
        # its own run again (a resumed trial): under the sweep's parent run, never one of a sweep made before
        # under the same name, nor one anybody else tagged with the trial id
        found = (tags.trial_run_filter(self.parent_run_id, self.trial_id) if self.parent_run_id
                 else f"tags.`{tags.TRIAL_ID}` = '{self.trial_id}'")
        existing = client.search_runs([experiment_id], filter_string=found, max_results=1)
        if existing:
            run_id = existing[0].info.run_id
            client.update_run(run_id, status="RUNNING")
            log.info("tracking: re-using run %s of trial %s", run_id, self.trial_id)
        else:
            run_tags = {tags.TRIAL_ID: self.trial_id, tags.RUN_NAME: self.run_name, **self.tags}
            if self.parent_run_id:
                run_tags[tags.PARENT_RUN] = self.parent_run_id
            run_id = client.create_run(experiment_id, tags=run_tags, run_name=self.run_name).info.run_id
        self.run_id = self.stats.run_id = run_id
        return client

    @property
    def _steps_path(self) -> Path | None:
        return self.spool_path.with_name("mlflow-steps.json") if self.spool_path is not None else None

    def _load_steps(self) -> None:
        path = self._steps_path
        if path is None or not path.exists():
            return
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            self._prior_run, steps = data["run_id"], data["steps"]
            self._prior_steps = {str(k): int(v) for k, v in steps.items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("tracking: %s is not a step record; earlier attempts' steps may be logged again", path)
            return
        self._sent_steps = dict(self._prior_steps)

    def _record_steps(self, metrics: list[MetricRecord]) -> None:
        """Remember the last step sent per metric (atomically: a replaced file, never a torn one)."""
        path = self._steps_path
        if path is None or not metrics:
            return
        if self._prior_run != self.run_id:  # another run (the earlier one was deleted): start a new record
            self._prior_run, self._prior_steps, self._sent_steps = self.run_id, {}, {}
        for m in metrics:
            if m.step > self._sent_steps.get(m.key, -1):
                self._sent_steps[m.key] = m.step
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({"run_id": self.run_id, "steps": self._sent_steps}), encoding="utf-8")
        tmp.replace(path)

    def _take_spool(self) -> list[_Op]:
        """Requests an earlier attempt of this trial spooled, oldest first, without its end-of-run status."""
        if self.spool_path is None:
            return []
        replaying = self.spool_path.with_name(self.spool_path.name + ".replaying")
        ops: list[_Op] = []
        for path in (replaying, self.spool_path):  # a .replaying file is older: its attempt died replaying
            if not path.exists():
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                try:
                    record = json.loads(line)
                    op = _Op(record["kind"], record["payload"])
                except (ValueError, KeyError, TypeError):
                    log.warning("tracking: %s:%d: not a spooled request, skipped", path, number)
                    continue
                if op.kind != "terminate":
                    ops.append(op)
        if not ops:
            replaying.unlink(missing_ok=True)
            self.spool_path.unlink(missing_ok=True)
            return []
        self._write_ops(replaying, ops, mode="w")  # one file holds them until they are sent
        self.spool_path.unlink(missing_ok=True)
        self._replaying = replaying
        log.info("tracking: sending %d requests spooled by an earlier attempt (%s)", len(ops), self.spool_path)
        return ops

    def _write_ops(self, path: Path, ops: list[_Op], *, mode: str) -> None:
        """Requests as JSON lines, the format `_take_spool` reads back."""
        with path.open(mode, encoding="utf-8") as handle:
            for op in ops:
                record = {"run_id": self.run_id, "trial_id": self.trial_id, "kind": op.kind, "payload": op.payload}
                handle.write(json.dumps(record) + "\n")

    def _spool(self, ops: list[_Op]) -> None:
        if self.spool_path is None:
            log.error("tracking: %d unsent MLflow requests lost (no spool path)", len(ops))
            return
        self._write_ops(self.spool_path, ops, mode="a")
        self.stats.spool = str(self.spool_path)
        log.error(
            "tracking: MLflow unreachable at exit; %d requests written to %s", len(ops), self.spool_path
        )


def _permanent(err: Exception) -> bool:
    code = getattr(err, "error_code", None)
    return isinstance(code, str) and code in PERMANENT_ERRORS


def _brief(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:200]
