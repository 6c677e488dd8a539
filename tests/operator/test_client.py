"""The operator's client (`SweepClient`, `crd_installed`): what it decides without the operator.

The Kubernetes client talks HTTP to `ApiServer`, a stand-in for the API server's part in these exchanges: it
serves the kubesweep.io discovery document, stores Sweep resources (server-side apply, merge patches of
annotations) and lists TrialSlices. `on_patch` plays the operator where a test needs one. The client against a
real control plane with the operator running is tests/operator/test_client_cluster.py."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes.client import ApiClient, Configuration

from kubesweep.backends.base import BackendError, Phase, SweepConflict, SweepNotFound
from kubesweep.backends.k8s_state import LABEL_SLICE, TrialEntry
from kubesweep.manifests import LABEL_SWEEP
from kubesweep.operator.client import OPERATOR_GRACE, SweepClient, crd_installed
from kubesweep.operator.store import ANNOTATION_CANCEL, ANNOTATION_RESUME, CLIENT_MANAGER, rfc3339
from kubesweep.plan import Plan, plan
from kubesweep.sweep_spec import parse_sweep
from kubesweep.wire.outcomes import Outcome

GV = "kubesweep.io/v1alpha1"
PREFIX = f"/apis/{GV}"
DIGEST = "registry.example/kubesweep-job@sha256:" + "ab" * 32


def discovery(*plurals: str) -> dict[str, Any]:
    return {"kind": "APIResourceList", "groupVersion": GV, "resources": [
        {"name": p, "kind": p.title(), "namespaced": True, "singularName": p[:-1], "verbs": ["get"]} for p in plurals]}


class ApiServer(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.discovery = (200, discovery("sweeps", "trialslices"))  # status code, body
        self.sweeps: dict[str, dict[str, Any]] = {}
        self.slices: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str, dict[str, list[str]], str]] = []  # method, path, query, content type
        self.on_patch: Callable[[dict[str, Any]], None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: ApiServer

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _not_found(self) -> None:
        self._send(404, {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404})

    def _route(self) -> tuple[str, str | None, dict[str, list[str]]]:
        url = urllib.parse.urlsplit(self.path)
        self.server.requests.append((self.command, url.path, urllib.parse.parse_qs(url.query),
                                     self.headers.get("Content-Type", "")))
        parts = url.path.removeprefix(f"{PREFIX}/namespaces/ns/").split("/")
        return parts[0], parts[1] if len(parts) > 1 else None, urllib.parse.parse_qs(url.query)

    def do_GET(self) -> None:
        if urllib.parse.urlsplit(self.path).path == PREFIX:
            self._route()
            self._send(*self.server.discovery)
            return
        kind, name, query = self._route()
        if kind == "sweeps" and name in self.server.sweeps:
            self._send(200, self.server.sweeps[name])
        elif kind == "trialslices":
            sweep = query["labelSelector"][0].split(",")[0].split("=")[1]
            self._send(200, {"items": [s for s in self.server.slices if s["metadata"]["labels"][LABEL_SWEEP] == sweep]})
        else:
            self._not_found()

    def do_PATCH(self) -> None:
        kind, name, _ = self._route()
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert kind == "sweeps" and name is not None
        if "apply-patch" in self.headers["Content-Type"]:
            current = self.server.sweeps.get(name) or {"status": {}}
            meta = {**body["metadata"], "uid": f"uid-{name}",
                    "creationTimestamp": current.get("metadata", {}).get("creationTimestamp") or rfc3339(time.time())}
            self.server.sweeps[name] = {**body, "metadata": meta, "status": current.get("status", {})}
        elif name not in self.server.sweeps:
            self._not_found()
            return
        else:  # a merge patch of annotations
            meta = self.server.sweeps[name]["metadata"]
            annotations = {**meta.get("annotations", {}), **body["metadata"]["annotations"]}
            meta["annotations"] = {k: v for k, v in annotations.items() if v is not None}
        if self.server.on_patch is not None:
            self.server.on_patch(self.server.sweeps[name])
        self._send(200, self.server.sweeps[name])


@pytest.fixture
def api() -> Iterator[ApiServer]:
    server = ApiServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def api_client(url: str) -> ApiClient:
    config = Configuration()
    config.host = url
    return ApiClient(config)


def client(api: ApiServer) -> SweepClient:
    return SweepClient("ns", api_client=api_client(api.url), poll=0.05)


def a_plan(name: str = "s", image: str = DIGEST, **spec: Any) -> Plan:
    return plan(parse_sweep({"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": name},
                             "spec": {"image": image, "matrix": {"batch_size": [8, 16, 32]},
                                      "resources": {"gpus_per_trial": 0}, **spec}},
                             allow_unpinned=True))  # the client checks the pin itself


def patches(api: ApiServer) -> list[tuple[str, str, dict[str, list[str]], str]]:
    return [r for r in api.requests if r[0] == "PATCH"]


# -- is the operator installed -------------------------------------------------------------------------------


def test_crd_installed_asks_discovery_for_the_sweeps_resource(api: ApiServer) -> None:
    assert crd_installed(api_client(api.url))
    api.discovery = (200, discovery("trialslices"))
    assert not crd_installed(api_client(api.url))
    api.discovery = (404, {"kind": "Status", "code": 404})
    assert not crd_installed(api_client(api.url))
    api.discovery = (403, {"kind": "Status", "code": 403, "reason": "Forbidden"})
    with pytest.raises(BackendError, match=r"cannot ask the API server for sweeps\.kubesweep\.io: 403"):
        crd_installed(api_client(api.url))


def test_crd_installed_says_when_the_api_server_cannot_be_reached() -> None:
    config = Configuration()
    config.host = "http://127.0.0.1:9"  # discard: nothing listens
    config.retries = 0
    with pytest.raises(BackendError, match="cannot reach the Kubernetes API"):
        crd_installed(ApiClient(config))


# -- submit ---------------------------------------------------------------------------------------------------


def test_submit_applies_the_sweep_as_the_cli_and_again_with_the_same_spec(api: ApiServer) -> None:
    c, p = client(api), a_plan()
    c.submit(p)
    [(_, path, query, content)] = patches(api)
    assert path == f"{PREFIX}/namespaces/ns/sweeps/s" and content.startswith("application/apply-patch+yaml")
    assert query["fieldManager"] == [CLIENT_MANAGER] and query["force"] == ["true"]
    assert api.sweeps["s"]["spec"]["image"] == DIGEST
    client(api).submit(a_plan())  # another shell, the same spec: applied again, no conflict
    assert len(patches(api)) == 2


def test_submit_refuses_a_different_spec_under_the_same_name_and_writes_nothing(api: ApiServer) -> None:
    client(api).submit(a_plan())
    with pytest.raises(SweepConflict, match="already exists in namespace ns with a different spec"):
        client(api).submit(a_plan(repeats=2))
    api.sweeps["s"]["spec"] = {"matrix": "unreadable"}  # a resource that no longer validates: a conflict too
    with pytest.raises(SweepConflict):
        client(api).submit(a_plan())
    assert len(patches(api)) == 1


def test_submit_refuses_an_unpinned_image_before_any_request(api: ApiServer) -> None:
    with pytest.raises(BackendError, match="not pinned by digest"):
        client(api).submit(a_plan(image="registry.example/kubesweep-job:latest"))
    assert api.requests == []


# -- status -------------------------------------------------------------------------------------------------------


def test_status_gives_every_planned_trial_with_the_phase_its_slice_holds(api: ApiServer) -> None:
    c, p = client(api), a_plan()
    c.submit(p)
    first, second, _ = p.trials
    api.slices.append({"metadata": {"name": "s-0", "labels": {LABEL_SWEEP: "s", LABEL_SLICE: "0"}}, "trials": {
        first.id: TrialEntry(Phase.SUCCEEDED, Outcome.SUCCEEDED, "", 100.0, 160.0, True).encode(),
        second.id: TrialEntry(Phase.RUNNING, None, "", 150.0).encode()}})
    status = c.status("s")
    assert [t.trial_id for t in status.trials] == [t.id for t in p.trials]
    assert [(t.phase, t.outcome) for t in status.trials] == [
        (Phase.SUCCEEDED, Outcome.SUCCEEDED), (Phase.RUNNING, None), (Phase.PENDING, None)]
    assert [t.attempts for t in status.trials] == [1, 1, 0]
    assert status.trials[0].finished_at == 160.0 and status.trials[0].axes == {"batch_size": 8}
    assert "waiting for the operator" in status.message
    with pytest.raises(SweepNotFound, match="no sweep named 'gone' in namespace ns"):
        c.status("gone")


def test_the_status_message_says_what_the_operator_reported_or_that_it_seems_absent(api: ApiServer) -> None:
    c = client(api)
    now = time.time()
    body: dict[str, Any] = {"metadata": {"name": "s", "creationTimestamp": rfc3339(now)}, "status": {}}
    assert c._message(body) == "namespace ns; Sweep s; waiting for the operator"
    body["metadata"]["creationTimestamp"] = rfc3339(now - OPERATOR_GRACE - 5)
    assert "no status from the operator yet: is it running?" in c._message(body)
    body["status"] = {"phase": "Running", "message": "2 of 3 trials started", "mlflowParentRunId": "abc"}
    assert c._message(body) == ("namespace ns; Sweep s; operator: Running (2 of 3 trials started); "
                                "MLflow parent run abc")


def test_waiting_on_a_sweep_the_operator_rejected_fails_with_its_message(api: ApiServer) -> None:
    c = client(api)
    c.submit(a_plan())
    api.sweeps["s"]["status"] = {"phase": "Invalid", "message": "unknown GPU type 'a100'"}
    with pytest.raises(BackendError, match="the operator rejected sweep 's': unknown GPU type 'a100'"):
        c.wait("s", timeout=5)


# -- requests the operator carries out ---------------------------------------------------------------------------


def test_cancel_and_resume_annotate_the_sweep_and_wait_for_the_operator(api: ApiServer) -> None:
    c = client(api)
    c.submit(a_plan())

    def operator(sweep: dict[str, Any]) -> None:
        annotations = sweep["metadata"].get("annotations", {})
        sweep["status"]["cancelled"] = annotations.get(ANNOTATION_CANCEL) == "true"
        if ANNOTATION_RESUME in annotations:
            sweep["status"]["resumeHandled"] = annotations[ANNOTATION_RESUME]

    api.on_patch = operator
    c.cancel("s")
    assert api.sweeps["s"]["metadata"]["annotations"] == {ANNOTATION_CANCEL: "true"}
    assert api.sweeps["s"]["status"]["cancelled"] is True
    c.resume("s")
    annotations = api.sweeps["s"]["metadata"]["annotations"]
    assert ANNOTATION_CANCEL not in annotations and len(annotations[ANNOTATION_RESUME]) == 12
    assert api.sweeps["s"]["status"]["resumeHandled"] == annotations[ANNOTATION_RESUME]
    merges = [r for r in patches(api) if r[3].startswith("application/merge-patch+json")]
    assert len(merges) == 2 and all(r[2]["fieldManager"] == [CLIENT_MANAGER] for r in merges)
    with pytest.raises(SweepNotFound):
        c.cancel("gone")


def test_trials_are_added_and_stopped_only_by_the_operator(api: ApiServer) -> None:
    c, p = client(api), a_plan()
    c.submit(p)
    with pytest.raises(BackendError, match="alone adds trials"):
        c.add_trials(p, p.trials[:1])
    writes = len(patches(api))
    with pytest.raises(BackendError, match="alone stops trials"):
        c.stop_trial("s", p.trials[0].name)
    assert len(patches(api)) == writes
    # it touches nothing but the Sweep and its TrialSlices (no Jobs, ConfigMaps, Kueue objects), and writes the Sweep
    assert {path.split("/")[6] for _, path, _, _ in api.requests} == {"sweeps", "trialslices"}
    assert {path.split("/")[6] for _, path, _, _ in patches(api)} == {"sweeps"}
