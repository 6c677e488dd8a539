"""The sweep's MLflow parent run, created through MLflow's REST API (stdlib HTTP; no mlflow package needed).

Idempotent across operator restarts: the run carries the tag `kubesweep.sweep-uid` (the Sweep resource's uid),
and an existing run with that tag is reused, so a process killed between creating the run and writing its id
into the Sweep's status creates no second one. It carries the tags every sweep's parent run has
(`kubesweep.sweep`, `kubesweep.role: parent`), by which `sweep results` and `sweep report` find it.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from kubesweep.tracking.runs import PARENT_ROLE, ROLE_TAG, SWEEP_TAG

TAG_UID = "kubesweep.sweep-uid"


class MlflowError(RuntimeError):
    pass


class MlflowRest:
    def __init__(self, uri: str, *, timeout: float = 10.0):
        if not uri.startswith(("http://", "https://")):
            raise MlflowError(f"the operator logs to an MLflow tracking server (http[s]://...), not {uri!r}")
        self.uri = uri.rstrip("/")
        self.timeout = timeout

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None,
              query: dict[str, str] | None = None) -> dict[str, Any]:
        url = f"{self.uri}/api/2.0/mlflow/{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                return json.loads(resp.read() or b"{}")  # type: ignore[no-any-return]
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            try:
                code = json.loads(detail).get("error_code", "")
            except ValueError:
                code = ""
            raise MlflowError(f"{method} {path}: HTTP {exc.code} {code or detail[:200]}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise MlflowError(f"cannot reach MLflow at {self.uri}: {exc}") from None

    def experiment_id(self, name: str) -> str:
        try:
            found = self._call("GET", "experiments/get-by-name", query={"experiment_name": name})
            return str(found["experiment"]["experiment_id"])
        except MlflowError as exc:
            if "RESOURCE_DOES_NOT_EXIST" not in str(exc):
                raise
        try:
            return str(self._call("POST", "experiments/create", {"name": name})["experiment_id"])
        except MlflowError as exc:  # created meanwhile by someone else
            if "RESOURCE_ALREADY_EXISTS" not in str(exc):
                raise
            return str(self._call("GET", "experiments/get-by-name", query={"experiment_name": name})
                       ["experiment"]["experiment_id"])

    def parent_run(self, experiment: str, sweep: str, uid: str) -> str:
        """The id of the sweep's parent run, created when there is none."""
        exp = self.experiment_id(experiment)
        found = self._call("POST", "runs/search", {"experiment_ids": [exp], "max_results": 1,
                                                   "filter": f"tags.`{TAG_UID}` = '{uid}'"})
        runs = found.get("runs") or []
        if runs:
            return str(runs[0]["info"]["run_id"])
        created = self._call("POST", "runs/create", {
            "experiment_id": exp, "run_name": sweep, "start_time": int(time.time() * 1000),
            "tags": [{"key": SWEEP_TAG, "value": sweep}, {"key": ROLE_TAG, "value": PARENT_ROLE},
                     {"key": TAG_UID, "value": uid},
                     {"key": "mlflow.runName", "value": sweep}]})
        return str(created["run"]["info"]["run_id"])
