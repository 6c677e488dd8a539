"""The MLflow app `sweep ui` serves (`mlflow server --app-name kubesweep`, the entry point `mlflow.app`
`kubesweep` in pyproject.toml): MLflow's own app plus one page, `GET /kubesweep/runs/<experiment id>`, that
opens a sweep's runs view as the browser's own view (kubesweep/tracking/view.py says why and in which formats).

For an experiment that carries kubesweep's view tag, the page writes the view into the browser's saved view of
that experiment (keeping the saved view's other keys: charts, pinned and hidden runs), marks MLflow's assistant
as already opened once (so its panel does not open by itself; a panel the user opened stays open), then replaces
itself with the plain runs URL, the sort in it. Any other experiment id goes to its plain runs page untouched;
anything that is not an experiment id (digits) is 404. Nothing of the request but the validated id reaches the
page, and every value in its script is JSON with `<`, `>` and `&` escaped.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from typing import Any

from flask import Flask, Response, abort, redirect
from werkzeug.wrappers import Response as BaseResponse

from kubesweep.tracking.view import (
    ASSISTANT_FLAG,
    SERVED_PATH,
    VIEW_TAG,
    plain_runs_fragment,
    saved_state,
    storage_key,
)

EXPERIMENT_ID = re.compile(r"[0-9]{1,20}")  # MLflow's ids: digits (sqlite and file stores)
SCRIPT = """(function () {
  var key = %(key)s, state = %(state)s, flag = %(flag)s, target = %(target)s;
  try {
    var saved = null;
    try { saved = JSON.parse(localStorage.getItem(key)); } catch (e) { saved = null; }
    if (!saved || typeof saved !== "object" || Array.isArray(saved)) { saved = {}; }
    for (var k in state) { if (Object.prototype.hasOwnProperty.call(state, k)) { saved[k] = state[k]; } }
    localStorage.setItem(key, JSON.stringify(saved));
    if (localStorage.getItem(flag) === null) { localStorage.setItem(flag, "true"); }
  } catch (e) { /* no localStorage: the plain runs page, with the sort */ }
  location.replace(target);
})();"""
PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>MLflow: the sweep's runs</title>
<meta name="referrer" content="no-referrer"></head>
<body><p>Opening the sweep's runs view&hellip; <a href="%(href)s">continue</a></p>
<script>%(script)s</script></body></html>
"""


def _js(value: Any) -> str:
    """`value` as a JavaScript literal that cannot end the script element or start markup."""
    return (json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _root() -> str:
    from mlflow.server.handlers import _add_static_prefix

    return str(_add_static_prefix("/"))


def _has_view(experiment_id: str) -> bool:
    """Whether the store's experiment `experiment_id` carries kubesweep's view tag (False when there is none)."""
    from mlflow.server.handlers import _get_tracking_store

    try:
        store: Any = _get_tracking_store()
        experiment = store.get_experiment(experiment_id)
    except Exception:  # no such experiment (MlflowException), or none readable: MLflow's page says so
        return False
    return VIEW_TAG in experiment.tags


def runs_page(experiment_id: str) -> BaseResponse:
    if not EXPERIMENT_ID.fullmatch(experiment_id):
        abort(404)
    if not _has_view(experiment_id):
        plain = redirect(f"{_root()}#/experiments/{experiment_id}/runs", code=302)
        plain.headers["Cache-Control"] = "no-store"
        return plain
    target = _root() + plain_runs_fragment(experiment_id)
    script = SCRIPT % {"key": _js(storage_key(experiment_id)), "state": _js(saved_state()),
                       "flag": _js(ASSISTANT_FLAG), "target": _js(target)}
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    page = PAGE % {"href": target.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;"),
                   "script": script}
    response = Response(page, status=200, mimetype="text/html")
    response.headers["Content-Security-Policy"] = (f"default-src 'none'; script-src 'sha256-{digest}'; "
                                                   "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response


def add_routes(app: Flask) -> None:
    from mlflow.server.handlers import _add_static_prefix

    app.add_url_rule(_add_static_prefix(SERVED_PATH + "<experiment_id>"), endpoint="kubesweep_runs_page",
                     view_func=runs_page, methods=["GET"])


def create_app(app: Flask | None = None) -> Any:
    """MLflow's app with kubesweep's page: under uvicorn (`mlflow server`'s default) the ASGI app that wraps
    the Flask app, as MLflow's own `basic-auth` app does; under gunicorn or waitress the Flask app."""
    from mlflow.environment_variables import _MLFLOW_SGI_NAME
    from mlflow.server import app as mlflow_app

    flask_app = app if app is not None else mlflow_app
    add_routes(flask_app)
    server: Any = _MLFLOW_SGI_NAME  # which server runs the app: `mlflow server` says
    if server.get() == "uvicorn":
        from mlflow.server.fastapi_app import create_fastapi_app

        return create_fastapi_app(flask_app)
    return flask_app
