"""The watch-backed caches (`kubesweep.backends.k8s_watch`): what is kept of a Job and a pod, and an `Informer`
listing in pages, applying watch events, resuming from the last resourceVersion and listing again after an
ERROR. The list function here stands for the API client's `list_namespaced_*`: it answers a list and a watch as
the API server does (JSON bodies, one event per line); the cluster tests run the same code against the server."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from kubesweep.backends import k8s_watch
from kubesweep.backends.k8s_watch import Informer, trim_job, trim_pod
from kubesweep.manifests import LABEL_SWEEP, LABEL_TRIAL


def obj(name: str, sweep: str | None = "s", version: str = "1", namespace: str = "ns") -> dict[str, Any]:
    labels = {LABEL_SWEEP: sweep, LABEL_TRIAL: name} if sweep else {}
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels, "resourceVersion": version},
            "status": {"phase": "Running"}}


def test_a_job_keeps_identity_owners_deadline_kueue_evictions_noted_and_status_only() -> None:
    job = {"metadata": {"name": "j", "namespace": "ns", "uid": "u", "finalizers": ["kubesweep.io/outcome"],
                        "labels": {LABEL_SWEEP: "s", LABEL_TRIAL: "t", "app": "x"},
                        "annotations": {"kubesweep.io/config": "{...}", "kubesweep.io/kueue-evictions": "1"},
                        "resourceVersion": "7",
                        "ownerReferences": [{"uid": "o1", "kind": "Sweep", "name": "s"}]},
           "spec": {"activeDeadlineSeconds": 60, "template": {"spec": {"containers": []}}, "parallelism": 1},
           "status": {"startTime": "T0", "active": 1, "ready": 1, "uncountedTerminatedPods": {},
                      "conditions": [{"type": "Complete", "status": "True", "reason": "Done", "message": "m",
                                      "lastTransitionTime": "T1", "lastProbeTime": "T1"}]}}
    assert trim_job(job) == {
        "metadata": {"name": "j", "namespace": "ns", "uid": "u", "finalizers": ["kubesweep.io/outcome"],
                     "labels": {LABEL_SWEEP: "s", LABEL_TRIAL: "t"}, "ownerReferences": [{"uid": "o1"}],
                     "annotations": {"kubesweep.io/kueue-evictions": "1"}},
        "spec": {"activeDeadlineSeconds": 60},
        "status": {"startTime": "T0", "active": 1, "conditions": [
            {"type": "Complete", "status": "True", "reason": "Done", "message": "m", "lastTransitionTime": "T1"}]}}
    assert trim_job({}) == {"metadata": {"labels": {}}, "spec": {}, "status": {"conditions": []}}


def test_a_pod_keeps_phase_scheduling_and_disruption_conditions_and_how_containers_ended() -> None:
    pod = {"metadata": {"name": "p", "labels": {LABEL_SWEEP: "s"}},
           "spec": {"containers": [{"name": "job", "image": "x"}]},
           "status": {"phase": "Failed", "reason": "Evicted", "message": "low on memory", "hostIP": "10.0.0.1",
                      "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"},
                                     {"type": "Ready", "status": "False"},
                                     {"type": "DisruptionTarget", "status": "True"}],
                      "containerStatuses": [
                          {"name": "job", "image": "x", "restartCount": 1, "state": {"running": {}},
                           "lastState": {"terminated": {"exitCode": 3, "reason": "Error", "message": "{}",
                                                        "finishedAt": "T1", "containerID": "c"}}}]}}
    assert trim_pod(pod) == {
        "metadata": {"name": "p", "labels": {LABEL_SWEEP: "s"}},
        "status": {"phase": "Failed", "reason": "Evicted", "message": "low on memory",
                   "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"},
                                  {"type": "DisruptionTarget", "status": "True"}],
                   "containerStatuses": [{"name": "job", "state": {}, "lastState": {"terminated": {
                       "exitCode": 3, "reason": "Error", "message": "{}", "finishedAt": "T1"}}}]}}


def test_events_update_the_sweep_index_and_return_the_version_to_resume_from() -> None:
    events: list[tuple[str, str]] = []
    inf = Informer(lambda *a, **k: None, "ns", LABEL_SWEEP, on_event=lambda kind, o: events.append(
        (kind, o["metadata"]["name"])))
    assert inf._apply({"type": "ADDED", "object": obj("a", version="5")}, "4") == "5"
    assert inf._apply({"type": "ADDED", "object": obj("b", sweep="t", version="6")}, "5") == "6"
    assert [o["metadata"]["name"] for o in inf.of_sweep("ns", "s")] == ["a"] and len(inf) == 2
    assert inf.changed.is_set()
    # a relabelled object moves between sweeps; one without the label is kept but indexed under none
    assert inf._apply({"type": "MODIFIED", "object": obj("b", sweep="s", version="7")}, "6") == "7"
    assert sorted(o["metadata"]["name"] for o in inf.of_sweep("ns", "s")) == ["a", "b"]
    assert inf.of_sweep("ns", "t") == [] and ("ns", "t") not in inf._by_sweep
    inf._apply({"type": "MODIFIED", "object": obj("b", sweep=None, version="8")}, "7")
    assert len(inf) == 2 and [o["metadata"]["name"] for o in inf.of_sweep("ns", "s")] == ["a"]
    # a bookmark only moves the version; DELETED drops the object; ERROR (410 Gone) asks for a new list
    assert inf._apply({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "20"}}}, "8") == "20"
    assert inf._apply({"type": "DELETED", "object": obj("a", version="21")}, "20") == "21"
    assert inf.of_sweep("ns", "s") == [] and len(inf) == 1
    assert inf._apply({"type": "ERROR", "object": {"code": 410, "reason": "Expired"}}, "21") == ""
    assert inf._apply({"type": "MODIFIED", "object": {"metadata": {"name": "b", "namespace": "ns"}}}, "22") == "22"
    assert events == [("ADDED", "a"), ("ADDED", "b"), ("MODIFIED", "b"), ("MODIFIED", "b"), ("DELETED", "a"),
                      ("MODIFIED", "b")]


class Response:
    def __init__(self, data: bytes = b"", lines: list[str] | None = None):
        self.data = data
        self.lines = lines or []
        self.released = False

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.lines)

    def release_conn(self) -> None:
        self.released = True


class ApiServer:
    """Answers LIST in pages (`limit`, `_continue`) and WATCH from a resourceVersion with queued event lines."""

    def __init__(self, objects: list[dict[str, Any]], version: str = "100"):
        self.objects = objects
        self.version = version
        self.lists: list[dict[str, Any]] = []
        self.watches: list[dict[str, Any]] = []
        self.streams: list[list[dict[str, Any]]] = []
        self.idle = threading.Event()

    def __call__(self, *args: Any, **kwargs: Any) -> Response:
        assert args == ("ns",) and kwargs["label_selector"] == LABEL_SWEEP and not kwargs["_preload_content"]
        if kwargs.get("watch"):
            self.watches.append(kwargs)
            if not self.streams:
                self.idle.set()
                time.sleep(0.05)
                return Response()
            return Response(lines=[json.dumps(e) for e in self.streams.pop(0)])
        self.lists.append(kwargs)
        start = int(kwargs["_continue"] or 0)
        page = self.objects[start:start + kwargs["limit"]]
        more = start + kwargs["limit"] < len(self.objects)
        body = {"items": page, "metadata": {"resourceVersion": self.version,
                                            "continue": str(start + kwargs["limit"]) if more else None}}
        return Response(json.dumps(body).encode())


def test_the_informer_lists_in_pages_follows_the_watch_and_lists_again_after_an_error(monkeypatch: Any) -> None:
    monkeypatch.setattr(k8s_watch, "PAGE", 2)
    server = ApiServer([obj(f"o{i}") for i in range(5)])
    server.streams = [[{"type": "ADDED", "object": obj("o5", version="101")},
                       {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "150"}}}],
                      [{"type": "DELETED", "object": obj("o0", version="151")},
                       {"type": "ERROR", "object": {"code": 410}}]]
    seen: list[str] = []
    inf = Informer(server, "ns", LABEL_SWEEP, trim=trim_pod, on_event=lambda kind, o: seen.append(kind)).start()
    try:
        assert inf.wait_synced(10)
        assert server.idle.wait(10)
    finally:
        inf.stop()
    assert [call["_continue"] for call in server.lists[:3]] == [None, "2", "4"]  # one list in pages of 2
    assert [w["resource_version"] for w in server.watches[:3]] == ["100", "150", "100"]  # after ERROR: list again
    assert len(server.lists) == 6 and all(w["allow_watch_bookmarks"] for w in server.watches)
    assert seen[:5] == ["LISTED"] * 5 and seen[5:7] == ["ADDED", "DELETED"] and seen[7:] == ["LISTED"] * 5
    # the second list replaced the cache: o5 (never listed) is gone, o0 (deleted, then listed) is back
    assert sorted(o["metadata"]["name"] for o in inf.of_sweep("ns", "s")) == [f"o{i}" for i in range(5)]
    assert "resourceVersion" not in inf.of_sweep("ns", "s")[0]["metadata"]  # kept trimmed
    assert inf.error is None
