"""The sweep's runs in MLflow: one parent run per sweep, the trials' child runs under it.

Layout (docs/tracking.md):
- experiment: the spec's `tracking.experiment`, default the sweep's name;
- parent run: tags `kubesweep.sweep=<name>`, `kubesweep.role=parent`, run name = the sweep's name; created by
  `sweep submit`, found again by those two tags on every later submit or resume (never a second one);
- child runs (made by the job's `kubesweep.jobs.mlflow_logger`): tag `mlflow.parentRunId=<parent>`,
  `kubesweep.trial_id`, `kubesweep.sweep`, cell tags, and the trial's `results.json` artifact;
- the report: artifacts `report/` of the parent run.

mlflow is imported inside the functions here, never at module import.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import sqlite3
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubesweep.tracking.target import TrackingTarget, artifact_dir, sqlite_path
from kubesweep.tracking.view import experiment_tags
from kubesweep.wire import tags
from kubesweep.wire.results import Results
from kubesweep.wire.results_file import MAX_RESULTS_BYTES, ResultsFileError, read_results_file

REPORT_ARTIFACTS = "report"
ANSWER_FILE = "answer.txt"  # the sweep's answer, on its parent run
RESULTS_ARTIFACT = "results.json"
PAGE = 1000


class TrackingError(RuntimeError):
    """MLflow could not do what was asked; the message names the server and the cause."""


class ServerAway(TrackingError):
    """The MLflow server did not answer (no connection: refused, unreachable, timed out): it may hold what was
    asked for, it could not say so (a server restarting, a port-forward gone)."""


def _no_connection(exc: BaseException) -> bool:
    """Whether `exc`, or what it was raised from or while handling, is a failed connection (MLflow's client wraps
    requests' ConnectionError, a connect timeout included, in an MlflowException raised while handling it)."""
    import requests

    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, requests.exceptions.ConnectionError):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


class UnusableStore(TrackingError):
    """The sqlite database a tracking URI names is not one SQLite can read (damaged, or another kind of file)."""


def check_sqlite(db: Path) -> None:
    """Raise `UnusableStore` when `db` exists and SQLite cannot read it: one line naming the file and what to do,
    before MLflow fails on it somewhere inside its schema set-up."""
    if not db.exists() or db.stat().st_size == 0:
        return
    try:
        with contextlib.closing(sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=30)) as conn:
            conn.execute("PRAGMA schema_version").fetchone()
    except sqlite3.DatabaseError as exc:
        if "locked" in str(exc):
            return  # another process writes it: a database
        raise UnusableStore(f"the MLflow store {db} cannot be read ({exc}): move it aside to start an empty one "
                            "(runs recorded in it are lost to kubesweep), or pass --tracking-uri or "
                            "--no-tracking") from None


@contextlib.contextmanager
def schema_lock(db: Path | None) -> Iterator[None]:
    """Hold `<db>.lock` (an exclusive file lock) while MLflow opens the sqlite database `db`: MLflow makes or
    migrates its schema on the first open and does not guard it against another process doing the same at once
    (a fresh home that two `sweep submit` open together). Nothing for a URI that is not a sqlite file."""
    if db is None:
        yield
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass(frozen=True)
class ChildRun:
    run_id: str
    name: str
    status: str  # RUNNING | FINISHED | FAILED | KILLED | SCHEDULED
    tags: dict[str, str]
    params: dict[str, str]
    metrics: dict[str, float]
    start_time_ms: int | None
    end_time_ms: int | None
    artifact_uri: str | None = None  # where its artifacts are (`mlflow-artifacts:/...` behind a proxying server)


@contextlib.contextmanager
def _quick_http() -> Iterator[None]:
    """Fail in seconds, not minutes, when the server is away (restores the environment after)."""
    settings = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
                "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
    saved = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def quiet() -> None:
    """No download progress bars and no INFO chatter on a command's stderr (a person asked for a table)."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    for name in ("alembic", "mlflow", "urllib3"):
        logging.getLogger(name).setLevel(logging.WARNING)


class SweepRuns:
    """MLflow operations on one sweep's runs."""

    def __init__(self, target: TrackingTarget, sweep: str):
        if target.uri is None:
            raise TrackingError(target.describe())
        self.target = target
        self.uri: str = target.uri
        self.sweep = sweep
        self._client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            db = sqlite_path(self.uri)
            if db is not None:
                check_sqlite(db)  # before importing MLflow: a damaged file is said at once
            quiet()
            try:
                from mlflow.tracking import MlflowClient
            except ImportError as exc:
                raise TrackingError(f"mlflow is not installed ({exc}): pip install 'kubesweep[tracking]'") from None
            quiet()  # importing mlflow sets its loggers' levels: set them again
            with schema_lock(db):  # the client opens the store, making its schema when it is new
                self._client = self._call("open the store", MlflowClient, tracking_uri=self.uri)
        return self._client

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        with _quick_http():
            try:
                return fn(*args, **kwargs)
            except TrackingError:
                raise
            except Exception as exc:
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
                if _no_connection(exc):
                    raise ServerAway(f"MLflow at {self.uri}: cannot {what}: the server did not answer: "
                                     f"{first}") from None
                raise TrackingError(f"MLflow at {self.uri}: cannot {what}: {first}") from None

    # -- experiment and parent run --------------------------------------------------------------------

    def experiment_id(self, *, create: bool) -> str | None:
        found = self._call("read the experiment", self.client.get_experiment_by_name, self.target.experiment)
        if found is not None:
            if found.lifecycle_stage == "deleted":
                raise TrackingError(f"MLflow at {self.uri}: experiment {self.target.experiment!r} is deleted; "
                                    "restore it (`mlflow experiments restore`) or set spec tracking.experiment")
            if create:  # an experiment made elsewhere, or by an older kubesweep: the training view too
                for key, value in experiment_tags().items():
                    if found.tags.get(key) != value:
                        self._call("tag the experiment", self.client.set_experiment_tag, found.experiment_id, key,
                                   value)
            return str(found.experiment_id)
        if not create:
            return None
        location = None
        if self.target.artifact_root is not None:
            folder = artifact_dir(self.target.artifact_root, self.target.experiment)
            folder.mkdir(parents=True, exist_ok=True)
            location = folder.resolve().as_uri()
        try:
            return str(self._call("create the experiment", self.client.create_experiment, self.target.experiment,
                                  artifact_location=location, tags=experiment_tags()))
        except TrackingError:  # another process (a second `sweep submit`) may have made it since the read
            raced = self._call("read the experiment", self.client.get_experiment_by_name, self.target.experiment)
            if raced is None:
                raise
            return str(raced.experiment_id)

    def find_parent(self) -> str | None:
        """The sweep's parent run id (the oldest, should two submits have raced), or None."""
        experiment = self.experiment_id(create=False)
        if experiment is None:
            return None
        runs = self._call(
            "search runs", self.client.search_runs, [experiment],
            filter_string=f"tags.`{tags.SWEEP}` = '{self.sweep}' and tags.`{tags.ROLE}` = '{tags.PARENT_ROLE}'",
            order_by=["attributes.start_time ASC"], max_results=10,
        )
        return str(runs[0].info.run_id) if runs else None

    def ensure_parent(self, *, backend: str, trials: int, spec: dict[str, Any] | None = None) -> tuple[str, bool]:
        """The sweep's parent run, created when missing; marked RUNNING. Returns (run id, created)."""
        found = self.find_parent()
        if found is not None:
            self._call("update the parent run", self.client.update_run, found, status="RUNNING")
            return found, False
        experiment = self.experiment_id(create=True)
        run_tags = {tags.SWEEP: self.sweep, tags.ROLE: tags.PARENT_ROLE, tags.BACKEND: backend,
                    tags.TRIALS: str(trials)}
        run = self._call("create the parent run", self.client.create_run, experiment, tags=run_tags,
                         run_name=self.sweep)
        run_id = str(run.info.run_id)
        if spec is not None:
            body = spec.get("spec", {})
            params = {"trials": trials, "repeats": body.get("repeats"),
                      "matrix": json.dumps(body.get("matrix", {}), sort_keys=True),
                      "job": json.dumps(body.get("job", {}), sort_keys=True)}
            from mlflow.entities import Param

            self._call("log the sweep's params", self.client.log_batch, run_id,
                       params=[Param(k, str(v)[:6000]) for k, v in params.items()])
            self._call("log the spec", self.client.log_dict, run_id, spec, "sweep.json")
        return run_id, True

    def finish_parent(self, run_id: str, status: str) -> None:
        self._call("end the parent run", self.client.set_terminated, run_id, status=status)

    def end_run(self, run_id: str, status: str) -> None:
        """End one of the sweep's runs (FINISHED, FAILED, KILLED)."""
        self._call("end a run", self.client.set_terminated, run_id, status=status)

    def status(self, run_id: str) -> str:
        """A run's status: RUNNING, FINISHED, FAILED, KILLED or SCHEDULED."""
        return str(self._call("read a run", self.client.get_run, run_id).info.status)

    # -- child runs ----------------------------------------------------------------------------------

    def experiment_of(self, run_id: str) -> str:
        """The id of the experiment the run is in (TrackingError: no such run here, or the server refused)."""
        return str(self._call("read the parent run", self.client.get_run, run_id).info.experiment_id)

    def children(self, parent_run_id: str) -> list[ChildRun]:
        experiment = self._call("read the parent run", self.client.get_run, parent_run_id).info.experiment_id
        out: list[ChildRun] = []
        token = None
        while True:
            page = self._call("search child runs", self.client.search_runs, [experiment],
                              filter_string=f"tags.`{tags.PARENT_RUN}` = '{parent_run_id}'", max_results=PAGE,
                              page_token=token)
            for run in page:
                out.append(ChildRun(
                    run_id=str(run.info.run_id), name=str(run.info.run_name or ""), status=str(run.info.status),
                    tags=dict(run.data.tags), params=dict(run.data.params), metrics=dict(run.data.metrics),
                    start_time_ms=run.info.start_time, end_time_ms=run.info.end_time,
                    artifact_uri=run.info.artifact_uri))
            token = getattr(page, "token", None)
            if not token:
                return out

    def results_file(self, run_id: str, dest: Path,
                     artifact_uri: str | None = None) -> Results | ResultsFileError | None:
        """A child run's `results.json` artifact, read as every results file is (`wire.results_file`: bounded in
        size and depth, validated); None when it has none, the `ResultsFileError` (one line naming the run) when
        it is not valid. One larger than a results file is not downloaded."""
        where = f"run {run_id}'s {RESULTS_ARTIFACT}"
        found = [a for a in self._call("list artifacts", self.client.list_artifacts, run_id)
                 if Path(a.path).name == RESULTS_ARTIFACT and not a.is_dir]
        if not found:
            return None
        size = found[0].file_size
        if size is not None and size > MAX_RESULTS_BYTES:
            return ResultsFileError(f"{where}: {size:,} bytes, more than a results file has ({MAX_RESULTS_BYTES:,})")
        if artifact_uri:
            # from the run's artifact store itself: the same bytes as `download_artifacts(run_id, ...)`, which goes
            # through a `runs:/` URI that also searches the run's logged models and, when either fails, says only
            # "Failed to download artifacts from path", losing the server's own words
            import mlflow.artifacts

            path = self._call("download results.json", mlflow.artifacts.download_artifacts,
                              artifact_uri=f"{artifact_uri.rstrip('/')}/{RESULTS_ARTIFACT}", dst_path=str(dest),
                              tracking_uri=self.uri)
        else:
            path = self._call("download results.json", self.client.download_artifacts, run_id, RESULTS_ARTIFACT,
                              str(dest))
        try:
            return read_results_file(Path(path), where)
        except ResultsFileError as exc:
            return exc

    def all_results(self, children: list[ChildRun]) -> dict[str, Results | ResultsFileError | None]:
        with tempfile.TemporaryDirectory(prefix="kubesweep-results-") as tmp:
            out = {}
            for i, child in enumerate(children):
                dest = Path(tmp) / str(i)
                dest.mkdir()
                out[child.run_id] = self.results_file(child.run_id, dest, child.artifact_uri)
            return out

    # -- report --------------------------------------------------------------------------------------

    def log_answer(self, parent_run_id: str, answer: dict[str, str], text: str) -> None:
        """The sweep's answer on its parent run: a tag per task, GPU type and objective, the lines as the run's
        description and as `answer.txt`."""
        from mlflow.entities import RunTag

        batch = [RunTag(k, v[:5000]) for k, v in answer.items()] + [RunTag(tags.NOTE, text[:5000])]
        self._call("log the answer", self.client.log_batch, parent_run_id, tags=batch)
        self._call("log the answer", self.client.log_text, parent_run_id, text, ANSWER_FILE)

    def log_report(self, parent_run_id: str, folder: Path) -> None:
        self._call("upload the report", self.client.log_artifacts, parent_run_id, str(folder), REPORT_ARTIFACTS)


def trial_id_of(child: ChildRun) -> str | None:
    return child.tags.get(tags.TRIAL_ID)
