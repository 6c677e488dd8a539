"""The MLflow requests a trial's logger makes (`mlflow_logger`), over one of two clients with the same methods.

- `RestClient`: an http(s) tracking server through MLflow's REST API, with the standard library alone. Importing
  the mlflow package costs a trial several seconds of CPU (pandas, its GenAI modules) that a trial on a shared
  node, or a CPU trial beside others, pays out of its training; this client needs none of it. It honours the
  environment MLflow's own client reads: `MLFLOW_TRACKING_USERNAME`/`MLFLOW_TRACKING_PASSWORD` (basic auth),
  `MLFLOW_TRACKING_TOKEN` (bearer), `MLFLOW_TRACKING_INSECURE_TLS`, `MLFLOW_TRACKING_SERVER_CERT_PATH` and
  `MLFLOW_HTTP_REQUEST_TIMEOUT` (a deadline for each whole request, not each read: `bounded_http`, which also
  caps an answer's size, `RESPONSE_TOO_LARGE` past it). Artifacts go to the server's artifact proxy
  (`mlflow-artifacts:` runs, what `mlflow server --serve-artifacts` gives) or to an http(s) artifact URI on the
  server's own origin; a run whose artifacts live anywhere else (another host or port, `file:`, a bucket) is
  refused before any request (`ARTIFACTS_ELSEWHERE`, `artifact_root`): its artifacts are not sent.
- `PackageClient`: mlflow's `MlflowClient`, for every other store (`sqlite:///`, `file:`, `databricks`), and
  for a server that wants a client certificate (`MLFLOW_TRACKING_CLIENT_CERT_PATH`), where it refuses artifacts
  elsewhere as `RestClient` does.

Both raise an error whose `error_code` is MLflow's (`RESOURCE_ALREADY_EXISTS`, ...) when the server refuses a
request, and another exception when it cannot be reached, which is what the logger retries on. `RestClient` follows
no redirect (`REDIRECT_NOT_FOLLOWED`, a refusal): the tracking URI's credentials go to that address alone.
"""

from __future__ import annotations

import base64
import json
import math
import mimetypes
import os
import ssl
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from kubesweep.jobs import bounded_http

API = "/api/2.0/mlflow"
ARTIFACTS_API = "/api/2.0/mlflow-artifacts/artifacts"
REDIRECTED = "REDIRECT_NOT_FOLLOWED"  # our code for a 3xx answer: the same request would be redirected again
TOO_LARGE = "RESPONSE_TOO_LARGE"  # our code for an answer past bounded_http's cap: it would be as large again
ARTIFACTS_ELSEWHERE = "ARTIFACTS_ELSEWHERE"  # our code for a run whose artifacts are not on the tracking server
# MLflow's own mapping of an HTTP status without an MLflow error body (its `get_error_code`)
_STATUS_CODES = {400: "BAD_REQUEST", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "ENDPOINT_NOT_FOUND",
                 500: "INTERNAL_ERROR", 501: "NOT_IMPLEMENTED", 503: "TEMPORARILY_UNAVAILABLE"}


@dataclass(frozen=True)
class MetricRecord:
    key: str
    value: float
    timestamp: int
    step: int


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    experiment_id: str
    artifact_uri: str = ""


@dataclass(frozen=True)
class Run:
    info: RunInfo


@dataclass(frozen=True)
class Experiment:
    experiment_id: str


class RestError(Exception):
    """A request the server answered with an error: `error_code` as MLflow names it."""

    def __init__(self, error_code: str, message: str) -> None:
        super().__init__(f"{error_code}: {message}")
        self.error_code = error_code


class TrackingClient(Protocol):
    """What the trial's logger asks of a tracking store."""

    def get_experiment_by_name(self, name: str) -> Any: ...
    def create_experiment(self, name: str) -> str: ...
    def get_run(self, run_id: str) -> Any: ...
    def search_runs(self, experiment_ids: list[str], filter_string: str, max_results: int) -> list[Any]: ...
    def create_run(self, experiment_id: str, tags: dict[str, str], run_name: str) -> Any: ...
    def update_run(self, run_id: str, status: str) -> None: ...
    def log_batch(self, run_id: str, metrics: list[MetricRecord] | None = None,
                  params: list[tuple[str, str]] | None = None, tags: list[tuple[str, str]] | None = None) -> None: ...
    def log_artifact(self, run_id: str, local_path: str, artifact_path: str | None = None) -> None: ...
    def log_artifacts(self, run_id: str, local_dir: str, artifact_path: str | None = None) -> None: ...
    def set_terminated(self, run_id: str, status: str) -> None: ...


def client_for(uri: str) -> TrackingClient:
    """The client for the tracking URI `uri`: REST for an http(s) server, mlflow's own client otherwise."""
    scheme = urllib.parse.urlsplit(uri).scheme
    if scheme in ("http", "https") and not os.environ.get("MLFLOW_TRACKING_CLIENT_CERT_PATH"):
        return RestClient(uri)
    return PackageClient(uri)


class RestClient:
    def __init__(self, uri: str) -> None:
        self.uri = uri.rstrip("/")
        self.timeout = float(os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT") or 120)
        self._headers: dict[str, str] = {}
        user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
        token = os.environ.get("MLFLOW_TRACKING_TOKEN")
        if user and password:
            self._headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        elif token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._context: ssl.SSLContext | None = None
        if urllib.parse.urlsplit(self.uri).scheme == "https":
            if os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() == "true":
                self._context = ssl._create_unverified_context()  # the user asked for it
            else:
                self._context = ssl.create_default_context(
                    cafile=os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH") or None)
        self._artifact_bases: dict[str, str] = {}
        self._opener = bounded_http.opener(self._context)

    # -- requests ---------------------------------------------------------------------------------------

    def _request(self, method: str, url: str, body: bytes | None, content_type: str) -> Any:
        try:
            answer = bounded_http.request(self._opener, url, method=method, data=body, seconds=self.timeout,
                                          headers={**self._headers, "Content-Type": content_type})
        except bounded_http.BodyTooLarge as err:
            raise RestError(TOO_LARGE, str(err)) from None
        if 300 <= answer.status < 400:
            raise RestError(REDIRECTED, f"HTTP {answer.status} to {answer.headers.get('Location', '?')!r}, not "
                            "followed (the tracking URI's credentials go to it alone)")
        if answer.status >= 400:
            try:
                found = json.loads(answer.body)
            except ValueError:
                found = None
            if isinstance(found, dict) and isinstance(found.get("error_code"), str):
                raise RestError(found["error_code"], str(found.get("message", ""))[:500])
            raise RestError(_STATUS_CODES.get(answer.status, f"HTTP_{answer.status}"),
                            answer.body.decode("utf-8", "replace")[:300])
        return json.loads(answer.body) if answer.body.strip() else {}

    def _call(self, method: str, endpoint: str, payload: dict[str, Any] | None = None) -> Any:
        url = f"{self.uri}{API}/{endpoint}"
        if method == "GET":
            query = urllib.parse.urlencode(payload or {})
            return self._request("GET", f"{url}?{query}" if query else url, None, "application/json")
        return self._request(method, url, json.dumps(payload or {}).encode(), "application/json")

    # -- the logger's requests --------------------------------------------------------------------------

    def get_experiment_by_name(self, name: str) -> Experiment | None:
        try:
            found = self._call("GET", "experiments/get-by-name", {"experiment_name": name})
        except RestError as err:
            if err.error_code == "RESOURCE_DOES_NOT_EXIST":
                return None
            raise
        return Experiment(str(found["experiment"]["experiment_id"]))

    def create_experiment(self, name: str) -> str:
        return str(self._call("POST", "experiments/create", {"name": name})["experiment_id"])

    def get_run(self, run_id: str) -> Run:
        return _run(self._call("GET", "runs/get", {"run_id": run_id})["run"])

    def search_runs(self, experiment_ids: list[str], filter_string: str, max_results: int) -> list[Run]:
        found = self._call("POST", "runs/search", {"experiment_ids": experiment_ids, "filter": filter_string,
                                                   "max_results": max_results})
        return [_run(r) for r in found.get("runs", [])]

    def create_run(self, experiment_id: str, tags: dict[str, str], run_name: str) -> Run:
        payload = {"experiment_id": experiment_id, "start_time": int(time.time() * 1000), "run_name": run_name,
                   "tags": [{"key": k, "value": v} for k, v in tags.items()]}
        return _run(self._call("POST", "runs/create", payload)["run"])

    def update_run(self, run_id: str, status: str) -> None:
        self._call("POST", "runs/update", {"run_id": run_id, "status": status})

    def set_terminated(self, run_id: str, status: str) -> None:
        self._call("POST", "runs/update", {"run_id": run_id, "status": status,
                                           "end_time": int(time.time() * 1000)})

    def log_batch(self, run_id: str, metrics: list[MetricRecord] | None = None,
                  params: list[tuple[str, str]] | None = None, tags: list[tuple[str, str]] | None = None) -> None:
        self._call("POST", "runs/log-batch", {
            "run_id": run_id,
            "metrics": [{"key": m.key, "value": _number(m.value), "timestamp": m.timestamp, "step": m.step}
                        for m in metrics or []],
            "params": [{"key": k, "value": v} for k, v in params or []],
            "tags": [{"key": k, "value": v} for k, v in tags or []]})

    def log_artifact(self, run_id: str, local_path: str, artifact_path: str | None = None) -> None:
        self._put(self._artifact_base(run_id), local_path, artifact_path)

    def log_artifacts(self, run_id: str, local_dir: str, artifact_path: str | None = None) -> None:
        base = self._artifact_base(run_id)
        root = Path(local_dir)
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            parent = path.parent.relative_to(root).as_posix()
            inner = "/".join(p for p in (artifact_path, "" if parent == "." else parent) if p)
            self._put(base, str(path), inner or None)

    # -- artifacts --------------------------------------------------------------------------------------

    def _artifact_base(self, run_id: str) -> str:
        """The URL of the run's artifact root on the tracking server (refused, RestError, anywhere else)."""
        if run_id not in self._artifact_bases:
            self._artifact_bases[run_id] = artifact_root(self.uri, self.get_run(run_id).info.artifact_uri)
        return self._artifact_bases[run_id]

    def _put(self, base: str, local_path: str, artifact_path: str | None) -> None:
        name = os.path.basename(local_path)
        segments = [*(artifact_path or "").split("/"), name]
        url = base + "/" + "/".join(urllib.parse.quote(s) for s in segments if s)
        kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
        self._request("PUT", url, Path(local_path).read_bytes(), kind)


def _origin(uri: str) -> tuple[str, str, int] | None:
    """scheme, host and port of an http(s) URL (the port its scheme implies when none is written)."""
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.hostname or "@" in parts.netloc:
        return None
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    return parts.scheme, parts.hostname.lower().rstrip("."), port


def artifact_root(tracking_uri: str, artifact_uri: str) -> str:
    """The URL under which a run of the tracking server `tracking_uri` whose artifact URI is `artifact_uri` keeps
    its artifacts: on the server's own artifact proxy (`mlflow-artifacts:`, with no host or the server's own), or
    an http(s) URL on the server's own origin (scheme, host and port). Anything else (another host or port,
    `file:`, a bucket) is refused, RestError ARTIFACTS_ELSEWHERE, before any request: the tracking URI's
    credentials go to that origin alone, and a trial writes no path the server names."""
    own = urllib.parse.urlsplit(tracking_uri)
    origin = _origin(tracking_uri)
    parts = urllib.parse.urlsplit(artifact_uri)
    if origin is not None and parts.scheme == "mlflow-artifacts" and not parts.query and not parts.fragment and (
            not parts.netloc or _origin(f"{own.scheme}://{parts.netloc}") == origin):
        path = "/".join(urllib.parse.quote(s) for s in parts.path.split("/") if s)
        return f"{own.scheme}://{own.netloc}{own.path.rstrip('/')}{ARTIFACTS_API}/{path}"
    if origin is not None and _origin(artifact_uri) == origin and not parts.query and not parts.fragment:
        return artifact_uri.rstrip("/")
    where = f"{origin[0]}://{origin[1]}:{origin[2]}" if origin else tracking_uri
    raise RestError(ARTIFACTS_ELSEWHERE, f"the run's artifact URI {artifact_uri[:200]!r} is not on the tracking "
                    f"server ({where}), whose credentials go there alone: its artifacts are not sent")


def _number(value: float) -> float | str:
    """A metric value as protobuf's JSON writes a double: NaN and the infinities as strings."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def _run(found: dict[str, Any]) -> Run:
    info = found["info"]
    return Run(RunInfo(str(info["run_id"]), str(info["experiment_id"]), str(info.get("artifact_uri", ""))))


class PackageClient:
    """mlflow's `MlflowClient` behind the same methods (mlflow imported here, on first use)."""

    def __init__(self, uri: str) -> None:
        from mlflow.tracking import MlflowClient

        self._client = MlflowClient(tracking_uri=uri)
        self._uri = uri

    def _check_artifacts(self, run_id: str) -> None:
        """On a tracking server, the run's artifacts go to it alone (`artifact_root`), as with `RestClient`: mlflow's
        client would send the server's credentials to wherever the run's artifact URI points."""
        if urllib.parse.urlsplit(self._uri).scheme in ("http", "https"):
            artifact_root(self._uri, self._client.get_run(run_id).info.artifact_uri)

    def get_experiment_by_name(self, name: str) -> Any:
        return self._client.get_experiment_by_name(name)

    def create_experiment(self, name: str) -> str:
        return str(self._client.create_experiment(name))

    def get_run(self, run_id: str) -> Any:
        return self._client.get_run(run_id)

    def search_runs(self, experiment_ids: list[str], filter_string: str, max_results: int) -> list[Any]:
        return list(self._client.search_runs(experiment_ids, filter_string=filter_string, max_results=max_results))

    def create_run(self, experiment_id: str, tags: dict[str, str], run_name: str) -> Any:
        return self._client.create_run(experiment_id, tags=tags, run_name=run_name)

    def update_run(self, run_id: str, status: str) -> None:
        self._client.update_run(run_id, status=status)

    def set_terminated(self, run_id: str, status: str) -> None:
        self._client.set_terminated(run_id, status=status)

    def log_batch(self, run_id: str, metrics: list[MetricRecord] | None = None,
                  params: list[tuple[str, str]] | None = None, tags: list[tuple[str, str]] | None = None) -> None:
        from mlflow.entities import Metric, Param, RunTag

        self._client.log_batch(run_id, metrics=[Metric(m.key, m.value, m.timestamp, m.step) for m in metrics or []],
                               params=[Param(k, v) for k, v in params or []],
                               tags=[RunTag(k, v) for k, v in tags or []])

    def log_artifact(self, run_id: str, local_path: str, artifact_path: str | None = None) -> None:
        self._check_artifacts(run_id)
        self._client.log_artifact(run_id, local_path, artifact_path)

    def log_artifacts(self, run_id: str, local_dir: str, artifact_path: str | None = None) -> None:
        self._check_artifacts(run_id)
        self._client.log_artifacts(run_id, local_dir, artifact_path)
