"""The operator's watch caches (`kubesweep.operator.cache.ClusterCache`): the count of changes per sweep that
tells a step whether anything of its sweep changed, and which caches hold a namespace."""

from __future__ import annotations

import kubernetes

from kubesweep.backends.k8s_watch import Informer
from kubesweep.manifests import LABEL_SWEEP
from kubesweep.operator.cache import ClusterCache


def labelled(name: str, namespace: str, sweep: str | None) -> dict:  # type: ignore[type-arg]
    return {"metadata": {"name": name, "namespace": namespace, "labels": {LABEL_SWEEP: sweep} if sweep else {}}}


def test_every_event_of_a_sweeps_jobs_and_pods_counts_as_a_change_of_that_sweep() -> None:
    cache = ClusterCache(kubernetes.client.ApiClient(), ["ns"])
    seen: list[tuple[str, str, str]] = []
    cache.on_event = lambda kind, event, obj: seen.append((kind, event, obj["metadata"]["name"]))
    cache._event("Job", "ADDED", labelled("j", "ns", "s"))
    cache._event("Pod", "MODIFIED", labelled("p", "ns", "s"))
    cache._event("Pod", "MODIFIED", labelled("q", "other", "s"))
    cache._event("Pod", "DELETED", labelled("x", "ns", None))
    assert (cache.changes("ns", "s"), cache.changes("other", "s"), cache.changes("ns", "t")) == (2, 1, 0)
    assert seen == [("Job", "ADDED", "j"), ("Pod", "MODIFIED", "p"), ("Pod", "MODIFIED", "q"),
                    ("Pod", "DELETED", "x")]


def test_the_caches_of_a_namespace_once_listed() -> None:
    cache = ClusterCache(kubernetes.client.ApiClient(), ["ns"])
    assert cache.synced("ns") is None and cache.size() == 0  # not started
    jobs, pods = (Informer(lambda *a, **k: None, "ns", LABEL_SWEEP) for _ in range(2))
    cache._informers["ns"] = (jobs, pods)
    for informer in (jobs, pods):
        informer.synced.set()
        informer._apply({"type": "ADDED", "object": labelled("o", "ns", "s")}, "1")
    assert cache.synced("ns") == (jobs, pods) and cache.synced("elsewhere") is None
    assert cache.size() == 2
    cache._informers = {None: (jobs, pods)}  # one pair for all namespaces holds every namespace
    assert cache.synced("elsewhere") == (jobs, pods)
    cache.stop()
    assert jobs.stopped.is_set() and pods.stopped.is_set()
