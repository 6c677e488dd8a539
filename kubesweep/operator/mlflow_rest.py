"""The sweep's MLflow parent run, created through MLflow's REST API (stdlib HTTP; no mlflow package needed), and
the operator's tags on its trials' runs (what Kueue did to them).

Idempotent across operator restarts: the run carries the tag `kubesweep.sweep-uid` (the Sweep resource's uid),
and an existing run with that tag is reused, so a process killed between creating the run and writing its id
into the Sweep's status creates no second one. It carries the tags every sweep's parent run has
(`kubesweep.sweep`, `kubesweep.role: parent`), by which `sweep results` and `sweep report` find it.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import secrets
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubesweep.jobs import bounded_http
from kubesweep.operator import ownership
from kubesweep.tracking.view import experiment_tags
from kubesweep.wire import tags

PENDING_PREFIX = "kubesweep-pending-"  # an experiment being made for a namespace, before it is sealed and named
MAX_ANSWER_BYTES = 4 * 1024 * 1024  # what the operator reads of one answer; its requests return one run at most
_OPENER = bounded_http.opener()  # bounded in bytes and seconds; follows no redirect (see bounded_http)


_ERROR_CODE = re.compile(r"[A-Z][A-Z_]{0,63}")
_TRIAL_ID = re.compile(r"[A-Za-z0-9._-]{1,200}")  # what a trial id is made of (plan.make_trial); quoted as is
_RUN_ID = re.compile(r"[A-Za-z0-9]{1,64}")  # MLflow's run ids (hex); quoted as is


class MlflowError(RuntimeError):
    pass


class ExperimentRefused(MlflowError):
    """The experiment a Sweep names is not its namespace's: the Sweep cannot use it (it is Invalid)."""


def _host_port(uri: str) -> tuple[str, int] | None:
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    return parts.hostname.lower().rstrip("."), port


def _server(uri: str) -> tuple[str, str, int, str] | None:
    """`uri` as a tracking server, whole: scheme, host, port and path (no trailing slash); None when it is not an
    http(s) URL with a host, or carries user info, a query or a fragment (no tracking server's address has them)."""
    parts = urllib.parse.urlsplit(uri)
    where = _host_port(uri)
    if where is None or "@" in parts.netloc or "?" in uri or "#" in uri:
        return None
    return parts.scheme, *where, parts.path.rstrip("/")


@dataclass(frozen=True)
class TrackingPolicy:
    """Which tracking servers the operator talks to, and with what.

    `default_uri` (the chart's own MLflow, or its `tracking.uri`) serves Sweeps that name none and is always
    allowed. It is compared whole (scheme, host, port and path; `is_default`): any other URI, another path on the
    same host and port included, is a server of the Sweep's own, which must name a host in `allowed_hosts`: `host`
    (any port), `host:port`, or `*.domain` (any name under it), and gets none of the chart's credentials. Nothing
    else is ever requested, so a Sweep cannot make the operator call an address of its choosing.
    `credentials_secret` names the Secret (in each sweep's namespace) whose `username`/`password` the trials log
    with."""

    default_uri: str | None = None
    allowed_hosts: Sequence[str] = field(default_factory=tuple)
    credentials_secret: str | None = None
    namespace_user_prefix: str | None = None  # the chart's MLflow: namespace NS's trials log as PREFIX + NS
    ownership_key: bytes | None = field(default=None, repr=False)  # seals the namespaces' experiments (`ownership`)

    def namespace_user(self, uri: str, namespace: str) -> str | None:
        """The MLflow user a namespace's trials log as on `uri`: on the chart's own server with per-namespace
        users, `namespace_user_prefix` + the namespace; else None (nothing to grant)."""
        return f"{self.namespace_user_prefix}{namespace}" if self.namespace_user_prefix and self.is_default(uri) \
            else None

    def experiment_name(self, uri: str, namespace: str, experiment: str) -> str:
        """The MLflow experiment a sweep of `namespace` naming `experiment` logs to on `uri`: on the chart's own
        server with per-namespace users, `<namespace>/<experiment>`, so the sweeps of two namespaces never ask for
        the same name; elsewhere `experiment` as it is."""
        return f"{namespace}/{experiment}" if self.namespace_user(uri, namespace) else experiment

    def is_default(self, uri: str) -> bool:
        """`uri` is the operator's own server, the only one its credentials go to: the same scheme, host, port and
        path (a trailing slash aside), with no user info, query or fragment."""
        own = _server(self.default_uri) if self.default_uri else None
        return own is not None and _server(uri) == own

    def client(self, uri: str) -> MlflowRest:
        """MLflow at `uri` as the operator talks to it: with its own credentials (this process's
        `MLFLOW_TRACKING_*`) and ownership key on its own server only, never on a server a Sweep names."""
        own = self.is_default(uri)
        return MlflowRest(uri, environ=None if own else {}, owner_key=self.ownership_key if own else None)

    def credentials_for(self, uri: str) -> str | None:
        """The Secret trials of a sweep logging to `uri` read credentials from: the chart's, for its own server
        only. A Sweep naming another allowed server gets none (its trials bring their own, or log anonymously)."""
        return self.credentials_secret if self.is_default(uri) else None

    def refusal(self, uri: str) -> str | None:
        """Why the operator will not use `uri` (None: it will)."""
        server = _server(uri)
        if server is None:
            return (f"spec.tracking.uri: expected an http:// or https:// URL with a host and no user info, query or "
                    f"fragment, got {uri[:200]!r}")
        if self.is_default(uri) or any(_matches(entry, *server[1:3]) for entry in self.allowed_hosts):
            return None
        allowed = ", ".join([*([self.default_uri.rstrip("/")] if self.default_uri else []),
                             *self.allowed_hosts]) or "none"
        return (f"spec.tracking.uri: {uri[:200]!r} is not a tracking server this operator may use: neither its own "
                f"server (exactly that URI) nor on a host allowed for Sweeps' own servers (allowed: {allowed}; the "
                "chart's value tracking.allowedHosts extends the list)")


def _matches(entry: str, host: str, port: int) -> bool:
    entry = entry.strip().lower()
    name, _, want_port = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
    if want_port and want_port != str(port):
        return False
    if name.startswith("*."):
        return host.endswith(name[1:])
    return host == name.rstrip(".")


class MlflowRest:
    """MLflow's REST API as the operator uses it. Credentials: `MLFLOW_TRACKING_USERNAME`/`_PASSWORD` (basic
    auth) or `MLFLOW_TRACKING_TOKEN` (bearer), as for MLflow's own client. Errors carry the HTTP status and
    MLflow's error code only, never a response body: they end up in the Sweep's status."""

    def __init__(self, uri: str, *, timeout: float = 10.0, environ: dict[str, str] | None = None,
                 owner_key: bytes | None = None):
        if not uri.startswith(("http://", "https://")):
            raise MlflowError(f"the operator logs to an MLflow tracking server (http[s]://...), not {uri!r}")
        self.uri = uri.rstrip("/")
        self.timeout = timeout
        self.owner_key = owner_key  # seals the experiments the operator makes for namespaces (`ownership`)
        env = os.environ if environ is None else environ
        self.headers = {"Content-Type": "application/json"}
        if env.get("MLFLOW_TRACKING_USERNAME"):
            pair = f"{env['MLFLOW_TRACKING_USERNAME']}:{env.get('MLFLOW_TRACKING_PASSWORD', '')}"
            self.headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        elif env.get("MLFLOW_TRACKING_TOKEN"):
            self.headers["Authorization"] = f"Bearer {env['MLFLOW_TRACKING_TOKEN']}"

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None,
              query: dict[str, str] | None = None, *, version: int = 2) -> dict[str, Any]:
        url = f"{self.uri}/api/{version}.0/mlflow/{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = json.dumps(body).encode() if body is not None else None
        try:
            answer = bounded_http.request(_OPENER, url, method=method, data=data, headers=self.headers,
                                          seconds=self.timeout, max_bytes=MAX_ANSWER_BYTES)
        except bounded_http.BodyTooLarge as exc:
            raise MlflowError(f"{method} {path}: {exc}") from None
        except (OSError, ValueError) as exc:  # unreachable, or past the request's deadline (TimeoutError)
            reason = getattr(exc, "reason", None) or type(exc).__name__
            raise MlflowError(f"cannot reach MLflow at {self.uri}: {reason}") from None
        if answer.status < 300:
            try:
                return json.loads(answer.body or b"{}")  # type: ignore[no-any-return]
            except ValueError:
                raise MlflowError(f"{method} {path}: HTTP {answer.status}, not MLflow's JSON") from None
        try:
            code = str(json.loads(answer.body[:4096]).get("error_code", ""))
        except (ValueError, AttributeError):
            code = ""
        code = code if _ERROR_CODE.fullmatch(code) else ""  # MLflow's codes only; no body is ever copied
        hint = {401: " (the operator's MLflow credentials were refused)",
                403: " (the operator's MLflow user lacks permission)"}.get(answer.status, "")
        if 300 <= answer.status < 400:
            hint = " (a redirect, which the operator does not follow)"
        raise MlflowError(f"{method} {path}: HTTP {answer.status} {code}{hint}".replace("  ", " ").rstrip())

    def experiment_id(self, name: str, namespace: str | None = None) -> str:
        """The experiment's id, created when missing; either way tagged for the UI's training view
        (`kubesweep.tracking.view`). With `namespace`, the experiment is that namespace's: one the operator made
        for it and sealed (`kubesweep.operator.ownership`); any other of that name (made by someone else, made for
        another namespace, renamed or retagged since) is refused (ExperimentRefused), so a Sweep of one namespace
        never gets rights on an experiment of another, nor on one a user set up for it."""
        if namespace is not None:
            return self._namespace_experiment(name, namespace)
        tags = experiment_tags()
        found = self._by_name(name)
        if found is None:
            try:
                return str(self._call("POST", "experiments/create", {
                    "name": name, "tags": [{"key": k, "value": v} for k, v in tags.items()]})["experiment_id"])
            except MlflowError as exc:  # created meanwhile by someone else
                if "RESOURCE_ALREADY_EXISTS" not in str(exc):
                    raise
                found = self._call("GET", "experiments/get-by-name", query={"experiment_name": name})["experiment"]
        self._set_tags(found, tags)
        return str(found["experiment_id"])

    def _by_name(self, name: str) -> dict[str, Any] | None:
        try:
            return self._call("GET", "experiments/get-by-name", query={"experiment_name": name})["experiment"]  # type: ignore[no-any-return]
        except MlflowError as exc:
            if "RESOURCE_DOES_NOT_EXIST" not in str(exc):
                raise
            return None

    def _set_tags(self, experiment: Mapping[str, Any], tags: Mapping[str, str]) -> None:
        have = {t.get("key"): t.get("value") for t in experiment.get("tags") or []}
        for key, value in tags.items():
            if have.get(key) != value:
                self._call("POST", "experiments/set-experiment-tag", {
                    "experiment_id": experiment["experiment_id"], "key": key, "value": value})

    def _namespace_experiment(self, name: str, namespace: str) -> str:
        key = self.owner_key
        if key is None:
            raise MlflowError("the operator has no ownership key (KUBESWEEP_MLFLOW_OWNERSHIP_KEY): it makes no "
                              "experiment for a namespace without one")
        found = self._by_name(name) or self._make_sealed(name, namespace, key)
        exp = str(found["experiment_id"])
        have = {t.get("key"): t.get("value") for t in found.get("tags") or []}
        identity = ownership.Identity.of(found)
        if identity is None:
            raise MlflowError(f"experiment {name!r}: MLflow does not say when it was made (creation_time), which "
                              "the operator's seal binds")
        if not ownership.sealed_for(key, identity, namespace, have):
            mine = ownership.owner(key, identity, have)
            whose = (f"belongs to the sweeps of namespace {mine}" if mine else
                     f"was not made by the operator for namespace {namespace} (its name and tags are not proof)")
            raise ExperimentRefused(f"experiment {name!r} {whose}: name another (spec.tracking.experiment)")
        if found.get("lifecycle_stage") == "deleted":
            raise ExperimentRefused(f"experiment {name!r} is deleted: an MLflow admin restores it, or name another "
                                    "(spec.tracking.experiment)")
        self._set_tags(found, {**experiment_tags(), tags.NAMESPACE: namespace})
        return exp

    def _make_sealed(self, name: str, namespace: str, key: bytes) -> dict[str, Any]:
        """Make the experiment for `namespace`, sealed before it bears its name: it is created under a name of its
        own, sealed, then renamed (a process stopped on the way leaves an unnamed experiment, never an unsealed one
        under the name). Another holding the name meanwhile is what this returns (checked by the caller)."""
        made_tags = {**experiment_tags(), tags.NAMESPACE: namespace}
        pending = f"{PENDING_PREFIX}{secrets.token_hex(8)}"
        exp = str(self._call("POST", "experiments/create", {
            "name": pending, "tags": [{"key": k, "value": v} for k, v in made_tags.items()]})["experiment_id"])
        made = self._call("GET", "experiments/get", query={"experiment_id": exp})["experiment"]
        identity = ownership.Identity.of(made)
        if identity is None or identity.experiment_id != exp:
            raise MlflowError(f"experiment {exp}: MLflow does not say when it was made (creation_time), which the "
                              "operator's seal binds")
        self._call("POST", "experiments/set-experiment-tag", {
            "experiment_id": exp, "key": tags.OWNER_SEAL, "value": ownership.seal(key, identity, namespace)})
        try:
            self._call("POST", "experiments/update", {"experiment_id": exp, "new_name": name})
        except MlflowError:
            taken = self._by_name(name)
            if taken is None:
                raise
            with contextlib.suppress(MlflowError):
                self._call("POST", "experiments/delete", {"experiment_id": exp})
            return taken
        return self._call("GET", "experiments/get", query={"experiment_id": exp})["experiment"]  # type: ignore[no-any-return]

    def grant(self, experiment_id: str, username: str, permission: str = "EDIT") -> None:
        """Give `username` `permission` on the experiment (MLflow's basic-auth app, its v3 grant; the caller needs
        MANAGE on the experiment, which its creator has). A grant already there is left as it is."""
        try:
            self._call("POST", "users/permissions/grant", {
                "username": username, "resource_type": "experiment", "resource_id": experiment_id,
                "permission": permission}, version=3)
        except MlflowError as exc:
            if "RESOURCE_ALREADY_EXISTS" not in str(exc):
                raise

    def parent_run(self, experiment: str, sweep: str, uid: str, *, namespace: str | None = None,
                   grant_to: str | None = None) -> str:
        """The id of the sweep's parent run, created when there is none. With `namespace`, the experiment must be
        that namespace's (`experiment_id`); `grant_to` (that namespace's MLflow user) gets EDIT on it, so its
        trials log there and nowhere else."""
        exp = self.experiment_id(experiment, namespace)
        if grant_to:
            self.grant(exp, grant_to)
        found = self._call("POST", "runs/search", {"experiment_ids": [exp], "max_results": 1,
                                                   "filter": f"tags.`{tags.SWEEP_UID}` = '{uid}'"})
        runs = found.get("runs") or []
        if runs:
            return str(runs[0]["info"]["run_id"])
        created = self._call("POST", "runs/create", {
            "experiment_id": exp, "run_name": sweep, "start_time": int(time.time() * 1000),
            "tags": [{"key": tags.SWEEP, "value": sweep}, {"key": tags.ROLE, "value": tags.PARENT_ROLE},
                     {"key": tags.SWEEP_UID, "value": uid},
                     {"key": tags.RUN_NAME, "value": sweep}]})
        return str(created["run"]["info"]["run_id"])

    def tag_trial_runs(self, parent_run_id: str, trial_tags: Mapping[str, Mapping[str, str]]) -> list[str]:
        """Set each trial's tags (trial id → tags) on its run under this parent run: the run its job made, tagged
        `kubesweep.trial_id` and `mlflow.parentRunId` (a sweep deleted and created again under its name has a new
        parent run in the same experiment; the old sweep's run of the same trial is left alone). Returns the
        trials that have no run yet."""
        bad = next((tid for tid in trial_tags if not _TRIAL_ID.fullmatch(tid)), None)
        if bad is not None:  # a trial id is quoted into a search filter: nothing else may get there
            raise MlflowError(f"not a trial id: {bad[:80]!r}")
        if not _RUN_ID.fullmatch(parent_run_id):  # so is the parent run's id
            raise MlflowError(f"not a run id: {parent_run_id[:80]!r}")
        experiment = self._call("GET", "runs/get", query={"run_id": parent_run_id})["run"]["info"]["experiment_id"]
        missing = []
        for tid, values in trial_tags.items():
            found = self._call("POST", "runs/search", {"experiment_ids": [experiment], "max_results": 1,
                                                       "filter": f"tags.`{tags.TRIAL_ID}` = '{tid}' AND "
                                                                 f"tags.`{tags.PARENT_RUN}` = '{parent_run_id}'"})
            runs = found.get("runs") or []
            if not runs:
                missing.append(tid)
                continue
            self._call("POST", "runs/log-batch", {"run_id": runs[0]["info"]["run_id"],
                                                  "tags": [{"key": k, "value": v} for k, v in values.items()]})
        return missing
