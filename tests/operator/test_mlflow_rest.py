"""The operator's tracking policy (which servers a Sweep may name) and its MLflow client's errors, which end up in a
Sweep's status: they carry an HTTP status and MLflow's error code, never a response body. A real local HTTP
server answers."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from kubesweep.operator.mlflow_rest import MlflowError, MlflowRest, TrackingPolicy
from kubesweep.wire.env import TrackingEnv
from tests.support.hostile_http import hostile_server

SECRET_BODY = "internal-service-says: db-password=hunter2"


def test_only_the_default_server_and_allowed_hosts_are_used() -> None:
    policy = TrackingPolicy("http://ks-mlflow.kubesweep.svc:5000", ("mlflow.example.com", "*.corp.example:443"))
    assert policy.refusal("http://ks-mlflow.kubesweep.svc:5000") is None
    assert policy.refusal("http://KS-MLFLOW.kubesweep.svc.:5000/") is None
    assert policy.refusal("https://mlflow.example.com") is None          # no port in the entry: any port
    assert policy.refusal("http://mlflow.example.com:8080") is None
    assert policy.refusal("https://tracking.corp.example") is None       # *.domain, port 443
    assert policy.refusal("http://tracking.corp.example:80") is not None
    for uri in ("http://ks-mlflow.kubesweep.svc:5001", "http://169.254.169.254/latest/meta-data",
                "http://10.0.0.7:5000", "http://mlflow.example.com.evil.io", "http://corp.example.evil:443"):
        message = policy.refusal(uri)
        assert message is not None and "not a tracking server this operator may use" in message, uri
        assert "tracking.allowedHosts" in message
    assert "expected an http:// or https:// URL" in str(policy.refusal("file:///etc/passwd"))
    assert "allowed: none" in str(TrackingPolicy().refusal("http://x:1"))


class _Server:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str, str | None]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                server.requests.append((self.command, self.path, self.headers.get("Authorization")))
                status, body = server.reply
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.reply: tuple[int, str] = (200, "{}")
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture()
def server() -> Iterator[_Server]:
    s = _Server()
    yield s
    s.httpd.shutdown()


@pytest.mark.parametrize("reply", [(500, SECRET_BODY), (403, json.dumps({"error_code": SECRET_BODY})),
                                   (200, SECRET_BODY), (404, "<html>" + SECRET_BODY)])
def test_no_response_body_reaches_an_error(server: _Server, reply: tuple[int, str]) -> None:
    server.reply = reply
    with pytest.raises(MlflowError) as err:
        MlflowRest(server.url, environ={}).experiment_id("e")
    assert "hunter2" not in str(err.value) and "internal-service" not in str(err.value)


def test_mlflow_error_codes_and_credentials(server: _Server) -> None:
    server.reply = (401, json.dumps({"error_code": "UNAUTHENTICATED", "message": SECRET_BODY}))
    with pytest.raises(MlflowError, match=r"HTTP 401 UNAUTHENTICATED \(the operator's MLflow credentials"):
        MlflowRest(server.url, environ={"MLFLOW_TRACKING_USERNAME": "u", "MLFLOW_TRACKING_PASSWORD": "p w"}
                   ).experiment_id("e")
    assert server.requests[-1][2] == "Basic " + base64.b64encode(b"u:p w").decode()
    with pytest.raises(MlflowError):
        MlflowRest(server.url, environ={"MLFLOW_TRACKING_TOKEN": "t0k"}).experiment_id("e")
    assert server.requests[-1][2] == "Bearer t0k"


def test_trials_read_the_credentials_from_a_secret_of_their_namespace() -> None:
    env = {e["name"]: e for e in TrackingEnv("http://m:5000", "exp", "run1", credentials_secret="creds").env()}
    assert env["MLFLOW_TRACKING_USERNAME"]["valueFrom"] == {"secretKeyRef": {"name": "creds", "key": "username"}}
    assert env["MLFLOW_TRACKING_PASSWORD"]["valueFrom"] == {"secretKeyRef": {"name": "creds", "key": "password"}}
    assert env["KUBESWEEP_TRACKING_SECRET"]["value"] == "creds"  # the tuner passes it on to its trials
    assert "MLFLOW_TRACKING_USERNAME" not in {e["name"] for e in TrackingEnv("http://m:5000", "exp").env()}


def test_a_redirect_is_not_followed_and_carries_no_credentials(server: _Server) -> None:
    """The attack: an allowed host answers 302 to a host of the attacker's choosing; urllib would repeat the
    request there, Basic auth header included. The operator follows no redirect: the 302 is an error, and the
    other host sees nothing."""
    elsewhere = _Server()
    try:
        server.reply = (302, "")
        original = server.httpd.RequestHandlerClass.end_headers

        def with_location(handler: Any) -> None:
            if server.reply[0] == 302:
                handler.send_header("Location", f"{elsewhere.url}/api/2.0/mlflow/experiments/get-by-name")
            original(handler)

        server.httpd.RequestHandlerClass.end_headers = with_location  # type: ignore[method-assign]
        with pytest.raises(MlflowError, match=r"HTTP 302 \(a redirect, which the operator does not follow\)"):
            MlflowRest(server.url, environ={"MLFLOW_TRACKING_USERNAME": "op", "MLFLOW_TRACKING_PASSWORD": "s3cret"}
                       ).experiment_id("e")
        assert len(server.requests) == 1 and elsewhere.requests == []
    finally:
        elsewhere.httpd.shutdown()


def test_the_operators_credentials_go_to_its_own_server_only() -> None:
    """The chart's MLflow credentials (the operator's, and the Secret its trials read) are for the chart's own
    server: a Sweep naming another allowed host gets neither."""
    policy = TrackingPolicy(default_uri="http://mlflow.ks.svc:5000", allowed_hosts=("*.example.com",),
                            credentials_secret="kubesweep-mlflow-trials")
    assert policy.is_default("http://mlflow.ks.svc:5000/") and policy.is_default("http://MLflow.ks.svc:5000")
    assert not policy.is_default("https://mlflow.ks.svc:5000") and not policy.is_default("http://mlflow.ks.svc:80")
    assert policy.credentials_for("http://mlflow.ks.svc:5000") == "kubesweep-mlflow-trials"
    assert policy.refusal("http://track.example.com:5000") is None  # allowed ...
    assert policy.credentials_for("http://track.example.com:5000") is None  # ... without the chart's credentials
    assert TrackingPolicy(credentials_secret="s").credentials_for("http://x:1") is None


def test_another_path_on_the_operators_server_is_not_its_server(server: _Server,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The attack: a Sweep's `spec.tracking.uri` is the chart's server with a path of its author's choosing,
    `<default>/api/2.0/mlflow/experiments/get-by-name?experiment_name=x&z=`. Compared on scheme, host and port
    alone it was the default server, and the operator sent its own credentials to that path (the rest of each
    request's path went into the query). Compared whole, it is not: a URI with a query is refused, and one with
    another path is a server of the Sweep's own, allowed only on `tracking.allowedHosts` and used there without
    the operator's credentials or the trials' Secret."""
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "kubesweep-operator")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "s3cret")
    server.reply = (404, json.dumps({"error_code": "RESOURCE_DOES_NOT_EXIST"}))
    attack = f"{server.url}/api/2.0/mlflow/experiments/get-by-name?experiment_name=x&z="
    policy = TrackingPolicy(server.url, credentials_secret="kubesweep-mlflow-trials",
                            namespace_user_prefix="kubesweep-ns-", ownership_key=b"k" * 32)
    assert "no user info, query or fragment" in str(policy.refusal(attack))
    for uri in (attack, f"{server.url}/api/2.0/mlflow/runs", f"{server.url}/#x", server.url.replace("//", "//op@")):
        assert not policy.is_default(uri) and policy.credentials_for(uri) is None, uri
        assert policy.namespace_user(uri, "team-a") is None and policy.refusal(uri) is not None, uri
    # on a host allowed for Sweeps' own servers, another path is used as such: without the operator's credentials
    allowed = TrackingPolicy(server.url, ("127.0.0.1",), "kubesweep-mlflow-trials", ownership_key=b"k" * 32)
    own_path = f"{server.url}/api/2.0/mlflow/runs"
    assert allowed.refusal(own_path) is None and allowed.credentials_for(own_path) is None
    with pytest.raises(MlflowError):
        allowed.client(own_path).experiment_id("e")
    assert server.requests and all(auth is None for _, _, auth in server.requests), server.requests
    # the operator's own server, written with a trailing slash, is still its own, with its credentials
    assert policy.is_default(server.url + "/") and policy.refusal(server.url + "/") is None
    with pytest.raises(MlflowError):
        policy.client(server.url + "/").experiment_id("e")
    assert server.requests[-1][2] == "Basic " + base64.b64encode(b"kubesweep-operator:s3cret").decode()


@pytest.mark.parametrize("mode", ["huge", "drip", "drip-headers"])
def test_an_answer_too_large_or_too_slow_is_cut_off(mode: str) -> None:
    """A tracking server answers 200 MB, or drips its answer (body, or headers) a byte every 0.2 s, each read
    within the per-read timeout: the operator read all of it, or waited as long as the server liked, while its
    step held a worker. It reads at most its cap and waits at most its timeout for the whole request."""
    with hostile_server(mode) as server:
        began = time.monotonic()
        with pytest.raises(MlflowError, match="larger than" if mode == "huge" else "cannot reach MLflow"):
            MlflowRest(server.url, timeout=1.5, environ={}).experiment_id("e")
        took = time.monotonic() - began
    assert took < 1.5 + 2.5, took  # the deadline, and a loaded machine's slack; not the server's 12 s


def test_kueues_words_are_tagged_on_the_trials_own_run(mlflow_server: Any) -> None:
    """Against a real `mlflow server`: the operator finds a trial's run by its `kubesweep.trial_id` tag in the
    parent run's experiment and tags it; a trial without a run yet is reported, and a trial id that could widen the
    search filter is refused before any request."""
    from mlflow.tracking import MlflowClient

    rest = MlflowRest(mlflow_server.url, environ={})
    parent = rest.parent_run("kueue-tags", "kueue-tags", "uid-kueue-tags")
    client = MlflowClient(tracking_uri=mlflow_server.url)
    experiment = client.get_run(parent).info.experiment_id
    mine = client.create_run(experiment, tags={"kubesweep.trial_id": "a1b2c3", "mlflow.parentRunId": parent})
    other = client.create_run(experiment, tags={"kubesweep.trial_id": "d4e5f6", "mlflow.parentRunId": parent})
    tags = {"kueue.evictions": "1", "kueue.last_eviction": "preempted by Kueue, requeued in LocalQueue q: ..."}
    # 0000ff: evicted before its job made a run
    assert rest.tag_trial_runs(parent, {"a1b2c3": tags, "0000ff": tags}) == ["0000ff"]
    assert {k: v for k, v in client.get_run(mine.info.run_id).data.tags.items() if k.startswith("kueue.")} == tags
    assert not any(k.startswith("kueue.") for k in client.get_run(other.info.run_id).data.tags)
    with pytest.raises(MlflowError, match="not a trial id"):
        rest.tag_trial_runs(parent, {"x' OR tags.`kubesweep.trial_id` != '": tags})
    assert not any(k.startswith("kueue.") for k in client.get_run(other.info.run_id).data.tags)


def test_a_sweep_made_again_under_its_name_gets_its_own_runs_tagged(mlflow_server: Any) -> None:
    """Against a real `mlflow server`: a sweep deleted and created again under its name has a new parent run in the
    same experiment, whose trials carry the same trial ids as the old sweep's. An eviction of the new sweep's trial
    tags the new sweep's run, under its own parent run, and never the old one's."""
    from mlflow.tracking import MlflowClient

    rest = MlflowRest(mlflow_server.url, environ={})
    client = MlflowClient(tracking_uri=mlflow_server.url)
    old_parent = rest.parent_run("made-again", "made-again", "uid-first")
    experiment = client.get_run(old_parent).info.experiment_id
    old = client.create_run(experiment, tags={"kubesweep.trial_id": "a1b2c3", "mlflow.parentRunId": old_parent})
    client.create_run(experiment, tags={"kubesweep.trial_id": "d4e5f6", "mlflow.parentRunId": old_parent})
    new_parent = rest.parent_run("made-again", "made-again", "uid-second")
    assert new_parent != old_parent and client.get_run(new_parent).info.experiment_id == experiment
    new = client.create_run(experiment, tags={"kubesweep.trial_id": "a1b2c3", "mlflow.parentRunId": new_parent})
    tags = {"kueue.evictions": "1", "kueue.last_eviction": "preempted by Kueue"}
    assert rest.tag_trial_runs(new_parent, {"a1b2c3": tags}) == []
    assert {k: v for k, v in client.get_run(new.info.run_id).data.tags.items() if k.startswith("kueue.")} == tags
    assert not any(k.startswith("kueue.") for k in client.get_run(old.info.run_id).data.tags)
    # a trial of the new sweep whose job made no run yet is reported, though the old sweep's trial had one
    assert rest.tag_trial_runs(new_parent, {"d4e5f6": tags}) == ["d4e5f6"]
    with pytest.raises(MlflowError, match="not a run id"):
        rest.tag_trial_runs("x' OR '1' = '1", {"a1b2c3": tags})
