"""Warm pods (`k8s_warm.WarmPods`, spec.warm_pods) in the Job reconciler, against the in-memory stand-in for the
API server of tests/backends/test_k8s_reconcile.py, with pods whose annotations and logs the test writes as a
kubelet and a worker would: what is handed over, made, recorded and stopped. Warm pods as real containers on a real
kubelet: the warm tests of tests/operator/test_controller_realnode.py."""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from kubesweep.backends import k8s_kueue
from kubesweep.backends.base import BackendError, Phase
from kubesweep.backends.k8s_client import Api
from kubesweep.backends.k8s_reconcile import JobReconciler, Listed
from kubesweep.backends.k8s_warm import INTERRUPTED, Pod, plan_handovers, slice_trial
from kubesweep.manifests import LABEL_TRIAL, LABEL_WORKER, render_trial
from kubesweep.plan import plan
from kubesweep.sweep_spec import parse_sweep
from kubesweep.wire.handover import HANDED_ANNOTATION, HANDOVER_ANNOTATION, MAX_HANDED, Handover, WorkerEvent, escape
from kubesweep.wire.outcomes import Outcome
from tests.backends.test_k8s_kueue import PENDING, FakeCustomApi, cond, workload
from tests.backends.test_k8s_reconcile import DIGEST, _Batch, _Resp, _Store
from tests.support.job_fixtures import REPO

T0 = time.time()  # the workers' clock: events are stamped with epoch seconds


class _Core:
    """Pods by name, each with the log its worker printed; hand-over patches as the API server takes them."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.logs: dict[str, list[str]] = {}
        self.patches: list[str] = []

    def list_namespaced_pod(self, namespace: str, **kwargs: Any) -> _Resp:
        return _Resp({"items": list(self.pods.values())})

    def patch_namespaced_pod(self, name: str, namespace: str, body: Mapping[str, Any], **kwargs: Any) -> _Resp:
        self.patches.append(name)
        self.pods[name]["metadata"].setdefault("annotations", {}).update(body["metadata"]["annotations"])
        return _Resp()

    def read_namespaced_pod_log(self, name: str, namespace: str, **kwargs: Any) -> str:
        if name not in self.pods:
            raise kubernetes.client.ApiException(status=404)
        return "".join(line + "\n" for line in self.logs.get(name, []))

    # -- what the Job controller, the kubelet and the worker do ------------------------------------------

    def start_pod(self, job: Mapping[str, Any], name: str, phase: str = "Running") -> None:
        self.pods[name] = {"metadata": {"name": name, "uid": f"uid-{name}", "labels": dict(job["metadata"]["labels"]),
                                        "ownerReferences": [{"uid": job["metadata"]["uid"]}],
                                        "creationTimestamp": f"2026-01-01T00:00:{len(self.pods):02d}Z"},
                           "status": {"phase": phase}}
        self.logs[name] = [WorkerEvent("ready", 1.0, reason="sweep s").line()]

    def handover(self, pod: str) -> Handover:
        return Handover.model_validate_json(self.pods[pod]["metadata"]["annotations"][HANDOVER_ANNOTATION])

    def run(self, pod: str, trial: str, *, at: float, code: int | None = 0, outcome: str = "succeeded",
            reason: str | None = None, lines: tuple[str, ...] = ()) -> None:
        """The worker starts `trial` (and ends it, unless `code` is None)."""
        log = self.logs[pod]
        log.append(WorkerEvent("start", at, trial=trial).line())
        log.extend(escape(line) for line in lines)
        if code is not None:
            log.append(WorkerEvent("end", at + 1, trial=trial, exit_code=code, outcome=outcome, reason=reason).line())


def warm_reconciler(custom: Any = None, **spec: Any) -> tuple[JobReconciler, _Store, _Batch, _Core]:
    sweep = parse_sweep({"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "s"},
                         "spec": {"image": DIGEST, "matrix": {"gpu": ["l4"], "batch_size": [8, 16, 32]},
                                  "warm_pods": True, **spec}})
    api = Api(kubernetes.client.ApiClient(), "ns")
    batch, core = _Batch(), _Core()
    api.batch, api.core = batch, core
    if custom is not None:  # Kueue's Workloads
        api.custom = custom
    store = _Store(sweep)
    engine = JobReconciler(api, store=store, source=Listed(), tracking=lambda state: None)
    engine.warm.logs.every = 0  # each step reads the logs the test just wrote
    return engine, store, batch, core


def test_a_warm_pod_gets_trials_one_ahead_runs_them_in_turn_and_is_closed_when_none_is_left() -> None:
    engine, store, batch, core = warm_reconciler(concurrency={"max_parallel": 1}, resources={"retries": 0})
    first = engine.reconcile(store.load("s"))
    t1, t2, t3 = (t.trial_id for t in first.trials)
    (name,) = batch.creates  # one slot: one warm Job, no trial Job
    job = batch.jobs[name]
    assert job["metadata"]["labels"][LABEL_WORKER] == "l4-1" and LABEL_TRIAL not in job["metadata"]["labels"]
    assert job["spec"]["template"]["spec"]["containers"][0]["command"][:3] == ["python", "-m",
                                                                              "kubesweep.jobs.worker"]
    assert [t.phase for t in first.trials] == [Phase.PENDING] * 3
    engine.reconcile(store.load("s"))
    assert batch.creates == [name]  # held while no pod shows it: not made twice

    core.start_pod(job, "w-1", phase="Pending")  # handed over before its container starts
    engine.reconcile(store.load("s"))
    handed = core.handover("w-1")
    assert [t.id for t in handed.trials] == [t1, t2] and not handed.closed and handed.sweep == "s"
    assert handed.trials[0].config["trial_id"] == t1 and handed.trials[0].config["job"]["batch_size"] == 8

    core.pods["w-1"]["status"]["phase"] = "Running"
    core.run("w-1", t1, at=T0 + 10.0, lines=("step 1/2", WorkerEvent("end", 0, trial=t3, exit_code=0).line()))
    core.run("w-1", t2, at=T0 + 20.0, code=None)
    status = engine.reconcile(store.load("s"))
    by_id = {t.trial_id: t for t in status.trials}
    assert store.state.outcomes[t1].outcome == Outcome.SUCCEEDED
    assert by_id[t1].started_at == pytest.approx(T0 + 10.0, abs=0.01)
    assert by_id[t2].phase == Phase.RUNNING and by_id[t3].phase == Phase.PENDING  # t3: a trial's line is no event
    handed = core.handover("w-1")
    assert [t.id for t in handed.trials] == [t2, t3] and handed.closed  # nothing of its kind left after t3

    core.logs["w-1"].append(WorkerEvent("end", T0 + 21.0, trial=t2, exit_code=3, outcome="oom").line())
    core.run("w-1", t3, at=T0 + 30.0)
    status = engine.reconcile(store.load("s"))
    assert {t: store.state.outcomes[t].outcome for t in (t2, t3)} == {t2: Outcome.OOM, t3: Outcome.SUCCEEDED}
    assert status.done and core.handover("w-1") == Handover(sweep="s", closed=True)  # the worker ends
    assert batch.creates == [name]
    assert slice_trial(core.logs["w-1"], t1) == ["step 1/2", WorkerEvent("end", 0, trial=t3, exit_code=0).line()]
    shown = {t.trial_id: t for t in status.trials}
    assert "".join(engine.logs("s", shown[t1], follow=False)).splitlines() == slice_trial(core.logs["w-1"], t1)


def test_an_evicted_warm_pods_trial_is_handed_over_again_and_a_failure_retried_with_its_next_attempt() -> None:
    engine, store, batch, core = warm_reconciler(concurrency={"max_parallel": 1}, resources={"retries": 1},
                                                 matrix={"gpu": ["l4"], "batch_size": [8]})
    engine.reconcile(store.load("s"))
    job = batch.jobs[batch.creates[0]]
    core.start_pod(job, "w-1")
    (t1,) = (t.trial_id for t in engine.reconcile(store.load("s")).trials)
    core.run("w-1", t1, at=T0 + 10.0, code=1, outcome="failed")
    status = engine.reconcile(store.load("s"))  # one failure of one allowed retry: pending again
    assert status.trials[0].phase == Phase.PENDING and "retrying after: exit code 1" in status.trials[0].reason
    engine.reconcile(store.load("s"))
    assert [(t.id, t.attempt) for t in core.handover("w-1").trials] == [(t1, 1)]  # run again, in the same pod

    core.run("w-1", t1, at=T0 + 20.0, code=None)
    assert engine.reconcile(store.load("s")).trials[0].phase == Phase.RUNNING
    # evicted: the worker stops the trial (it keeps its checkpoint), the Job controller makes another pod
    core.logs["w-1"].append(WorkerEvent("end", T0 + 25.0, trial=t1, exit_code=1, outcome="cancelled",
                                        reason=INTERRUPTED).line())
    core.pods["w-1"]["status"] = {"phase": "Failed", "reason": "Evicted"}
    status = engine.reconcile(store.load("s"))
    assert status.trials[0].phase == Phase.PENDING and t1 not in store.state.outcomes  # no end: handed over again
    core.start_pod(job, "w-2")
    engine.reconcile(store.load("s"))
    assert [(t.id, t.attempt) for t in core.handover("w-2").trials] == [(t1, 2)]
    assert "w-1" not in core.patches[-1:]  # the ended pod is never handed anything
    core.run("w-2", t1, at=T0 + 30.0)
    engine.reconcile(store.load("s"))
    assert store.state.outcomes[t1].outcome == Outcome.SUCCEEDED
    assert store.state.outcomes[t1].started_at == pytest.approx(T0 + 10.0, abs=0.01)  # its first start


def test_a_trial_running_when_its_warm_pod_is_killed_at_its_memory_limit_is_oom() -> None:
    engine, store, batch, core = warm_reconciler(concurrency={"max_parallel": 1})
    engine.reconcile(store.load("s"))
    core.start_pod(batch.jobs[batch.creates[0]], "w-1")
    t1 = engine.reconcile(store.load("s")).trials[0].trial_id
    core.run("w-1", t1, at=T0 + 10.0, code=None)
    core.pods["w-1"]["status"] = {"phase": "Failed", "containerStatuses": [
        {"name": "job", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}
    engine.reconcile(store.load("s"))
    assert store.state.outcomes[t1].outcome == Outcome.OOM and "OOMKilled" in store.state.outcomes[t1].reason


def test_a_trial_whose_warm_pods_keep_ending_under_it_is_failed_not_run_for_ever() -> None:
    engine, store, batch, core = warm_reconciler(concurrency={"max_parallel": 1}, resources={"retries": 0},
                                                 matrix={"gpu": ["l4"], "batch_size": [8]})
    engine.reconcile(store.load("s"))
    job = batch.jobs[batch.creates[0]]
    t1 = None
    for n in range(1, 4):
        core.start_pod(job, f"w-{n}")
        status = engine.reconcile(store.load("s"))
        t1 = status.trials[0].trial_id
        core.run(f"w-{n}", t1, at=T0 + n, code=None)
        engine.reconcile(store.load("s"))
        core.pods[f"w-{n}"]["status"] = {"phase": "Failed"}  # the worker died with it, no word
        status = engine.reconcile(store.load("s"))
    assert t1 is not None and store.state.outcomes[t1].outcome == Outcome.FAILED
    assert store.state.outcomes[t1].reason == "its warm pod ended 3 times while it ran"


def test_trials_handed_to_a_warm_pod_the_scheduler_cannot_place_say_why() -> None:
    engine, store, batch, core = warm_reconciler(concurrency={"max_parallel": 1})
    engine.reconcile(store.load("s"))
    core.start_pod(batch.jobs[batch.creates[0]], "w-1", phase="Pending")
    core.pods["w-1"]["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                                 "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]
    engine.reconcile(store.load("s"))
    status = engine.reconcile(store.load("s"))
    waiting = [t for t in status.trials if t.phase == Phase.UNSCHEDULABLE]
    assert len(waiting) == 2 and "Insufficient nvidia.com/gpu" in waiting[0].reason  # the two handed to it
    assert batch.creates == [batch.creates[0]]  # its slot still held: no second warm pod for the same slot


def test_stop_and_cancel_take_trials_out_and_delete_the_warm_pods() -> None:
    engine, store, batch, core = warm_reconciler(concurrency={"max_parallel": 1})
    engine.reconcile(store.load("s"))
    job = batch.jobs[batch.creates[0]]
    core.start_pod(job, "w-1")
    t1, t2, t3 = (t.trial_id for t in engine.reconcile(store.load("s")).trials)
    core.run("w-1", t1, at=T0 + 10.0, code=None)
    status = engine.reconcile(store.load("s"))
    engine.stop(store.load("s"), status.trials[0], "asha")
    assert [t.id for t in core.handover("w-1").trials] == [t2]  # its worker stops it
    assert store.state.outcomes[t1].outcome == Outcome.STOPPED
    engine.cancel(store.load("s"))
    assert batch.deleted == [job["metadata"]["name"]]
    assert {store.state.outcomes[t].outcome for t in (t2, t3)} == {Outcome.CANCELLED}


def test_a_trial_past_its_deadline_is_recorded_failed_and_taken_out() -> None:
    engine, store, batch, core = warm_reconciler(concurrency={"max_parallel": 1},
                                                 resources={"deadline_seconds": 60})
    engine.reconcile(store.load("s"))
    core.start_pod(batch.jobs[batch.creates[0]], "w-1")
    t1 = engine.reconcile(store.load("s")).trials[0].trial_id
    core.run("w-1", t1, at=T0 - 61.0, code=None)
    engine.reconcile(store.load("s"))
    assert store.state.outcomes[t1].outcome == Outcome.FAILED
    assert store.state.outcomes[t1].reason == "deadline exceeded after 60 s"
    engine.reconcile(store.load("s"))
    assert t1 not in [t.id for t in core.handover("w-1").trials]


def test_a_warm_pods_log_is_data() -> None:
    """Event lines that are not events, or name no trial of the sweep, change nothing; a pod's hand-over that is
    not one is read as none."""
    engine, store, batch, core = warm_reconciler(concurrency={"max_parallel": 1})
    engine.reconcile(store.load("s"))
    core.start_pod(batch.jobs[batch.creates[0]], "w-1")
    core.logs["w-1"] += ['kubesweep.worker {"event": "end", "at": "x", "trial": "t"}', "kubesweep.worker \x1b[2J",
                         json.dumps({"event": "end"})]
    core.pods["w-1"]["metadata"]["annotations"] = {HANDOVER_ANNOTATION: "{not json"}
    status = engine.reconcile(store.load("s"))
    assert [t.phase for t in status.trials] == [Phase.PENDING] * 3
    assert len(core.handover("w-1").trials) == 2


def test_a_driver_that_may_not_patch_pods_is_told_what_warm_pods_need_and_the_way_out() -> None:
    """Warm pods are the default: a `--direct` user whose role lacks `patch` on pods gets the API server's words,
    the right that is missing and `spec.warm_pods: false`, not trials that never start."""
    engine, store, batch, core = warm_reconciler(concurrency={"max_parallel": 1})
    engine.reconcile(store.load("s"))
    (name,) = batch.creates
    core.start_pod(batch.jobs[name], "w-1")
    body = json.dumps({"reason": "Forbidden", "message": 'pods "w-1" is forbidden: User "alice" cannot patch '
                                                         'resource "pods" in API group "" in the namespace "ns"'})

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise kubernetes.client.ApiException(status=403, reason="Forbidden", body=body)

    core.patch_namespaced_pod = refuse  # type: ignore[method-assign]
    with pytest.raises(BackendError) as refused:
        engine.reconcile(store.load("s"))
    message = str(refused.value)
    assert message.startswith('Forbidden: pods "w-1" is forbidden: User "alice" cannot patch'), message
    assert "`patch` on pods in namespace 'ns'" in message and "spec.warm_pods: false" in message


def test_a_trial_waiting_for_its_warm_pods_admission_says_so_in_kueues_words(monkeypatch: pytest.MonkeyPatch
                                                                            ) -> None:
    """With spec.queue a warm Job is created suspended; until Kueue admits it, the trials of its slot kind (which no
    pod has yet) show Kueue's words on its Workload, as a trial's own Job would, and nothing else does."""
    monkeypatch.setattr(k8s_kueue, "PASSING_S", 0.0)  # the reader reads a Workload it has not seen at each step
    workloads: list[dict[str, Any]] = []
    api_custom = FakeCustomApi(workloads)
    engine, store, batch, core = warm_reconciler(queue="team-a", concurrency={"max_parallel": 1},
                                                 custom=api_custom)
    engine.reconcile(store.load("s"))
    (name,) = batch.creates
    assert batch.jobs[name]["spec"]["suspend"] is True
    workloads.append(workload(cond("QuotaReserved", "False", "Pending", PENDING)))
    workloads[-1]["metadata"]["ownerReferences"] = [{"kind": "Job", "uid": batch.jobs[name]["metadata"]["uid"]}]
    status = engine.status(store.load("s"))
    assert {t.phase for t in status.trials} == {Phase.PENDING}
    assert all(t.reason.startswith("waiting for quota in LocalQueue team-a: couldn't assign flavors")
               for t in status.trials), [t.reason for t in status.trials]

    batch.jobs[name]["spec"]["suspend"] = False  # admitted: its pod comes, and is handed the first two trials
    core.start_pod(batch.jobs[name], "w-1")
    engine.reconcile(store.load("s"))
    status = engine.status(store.load("s"))
    assert [t.reason for t in status.trials] == ["handed to a warm pod", "handed to a warm pod", ""]


def test_a_trial_with_a_job_of_its_own_keeps_it_and_is_never_handed_to_a_warm_pod() -> None:
    """A Sweep applied without spec.warm_pods while a pod per trial was the default had its first trial's Job made
    then; read by today's driver, whose default is warm pods, that trial stays with its Job (never handed over,
    never run twice) and the others run in a warm pod."""
    engine, store, batch, core = warm_reconciler(concurrency={"max_parallel": 2}, resources={"retries": 0})
    old = parse_sweep({**store.state.sweep.to_document(),
                       "spec": {**store.state.sweep.to_document()["spec"], "warm_pods": False}})
    first = plan(old).trials[0]
    (job,) = [o for o in render_trial(first, old, image=DIGEST, namespace="ns") if o["kind"] == "Job"]
    batch.create_namespaced_job("ns", job)
    t1, t2, t3 = (t.id for t in plan(store.state.sweep).trials)
    assert t1 == first.id

    engine.reconcile(store.load("s"))
    (warm_job,) = [n for n in batch.creates if n != job["metadata"]["name"]]  # the one slot left: a warm pod
    core.start_pod(batch.jobs[warm_job], "w-1")
    engine.reconcile(store.load("s"))
    assert [t.id for t in core.handover("w-1").trials] == [t2, t3]
    batch.finish(t1)
    core.run("w-1", t2, at=T0 + 10.0)
    core.run("w-1", t3, at=T0 + 20.0)
    status = engine.reconcile(store.load("s"))
    assert {t: store.state.outcomes[t].outcome for t in (t1, t2, t3)} == dict.fromkeys((t1, t2, t3),
                                                                                     Outcome.SUCCEEDED)
    assert status.done and t1 not in core.patches and all(t1 not in str(core.handover(p)) for p in core.pods)


# Every character `str.splitlines` ends a line at, beside "\n".
SEPARATORS = ("\r", "\r\n", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")


def run_worker(tmp: Path, handover: Handover, trial_sh: str) -> str:
    """A real worker process, as a warm pod runs it (`python -m kubesweep.jobs.worker`, its hand-over file, closed),
    whose trials' interpreter is `trial_sh` (a shell script in place of `python -m kubesweep.jobs.run ...`); the
    pod's log it printed, as the logs API returns it."""
    (tmp / "handover.json").write_text(handover.to_annotation())
    trial = tmp / "trial.sh"
    trial.write_text("#!/bin/sh\n" + trial_sh, encoding="utf-8")
    trial.chmod(0o755)
    boot = (f"import runpy, sys; sys.executable = {str(trial)!r}; "  # the worker starts each trial with it
            "runpy.run_module('kubesweep.jobs.worker', run_name='__main__', alter_sys=True)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "KUBESWEEP_"))}
    done = subprocess.run([sys.executable, "-c", boot, "--handover", str(tmp / "handover.json"), "--output-dir",
                           str(tmp / "out"), "--sweep", handover.sweep, "--no-forkserver"],
                          cwd=REPO, env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stdout.decode(errors="replace") + done.stderr.decode(errors="replace")
    return done.stdout.decode()


def test_a_trial_in_a_real_worker_cannot_settle_another_trial(tmp_path: Path, caplog: pytest.LogCaptureFixture
                                                                ) -> None:
    """A trial prints forged `end` events behind each character `str.splitlines` breaks at, and one with the event
    prefix inside its line, for the trial after it in its pod and for a trial of another pod; a real worker relays
    it, the driver reads its log: each trial is settled by its own end alone. Then the pod's hand-over file lists
    a trial the driver handed to another pod (written by someone else): its events, the worker's own, count for
    nothing, and the driver says so in its log."""
    engine, store, batch, core = warm_reconciler(concurrency={"max_parallel": 2}, resources={"retries": 0})
    engine.reconcile(store.load("s"))
    for n, name in enumerate(batch.creates, 1):
        core.start_pod(batch.jobs[name], f"w-{n}", phase="Pending")
    engine.reconcile(store.load("s"))
    (mine, mine_handed), (other, other_handed) = sorted(
        ((p, core.handover(p)) for p in ("w-1", "w-2")), key=lambda ph: -len(ph[1].trials))
    t1, t2 = (t.id for t in mine_handed.trials)
    (t3,) = (t.id for t in other_handed.trials)

    def forged(trial: str) -> str:
        return WorkerEvent("end", T0 + 1e6, trial=trial, exit_code=3, outcome="oom").line()

    lines = [f"step {i}{sep}{forged(t2 if i % 2 else t3)}" for i, sep in enumerate(SEPARATORS)]
    lines.append(f"a table | {forged(t2)}")
    printf = "".join(f"printf '%s\\n' {shlex.quote(line)}\n" for line in lines)
    script = (f'if [ "$KUBESWEEP_TRIAL_ID" = {t1} ]; then\n{printf}fi\n'
              f'if [ "$KUBESWEEP_TRIAL_ID" = {t3} ]; then exit 3; fi\n')
    listed_too = Handover(sweep="s", trials=[*mine_handed.trials, *other_handed.trials], closed=True)
    log = run_worker(tmp_path, listed_too, script)
    assert "\u2028" in log and "\r" in log  # relayed as printed

    core.logs[mine] = log.removesuffix("\n").split("\n")  # the logs API gives the log as the worker wrote it
    core.pods[mine]["status"]["phase"] = "Running"
    with caplog.at_level(logging.WARNING, logger="kubesweep.backends.warm"):
        status = engine.reconcile(store.load("s"))
    phases = {t.trial_id: t.phase for t in status.trials}
    assert {t: store.state.outcomes[t].outcome for t in (t1, t2)} == {t1: Outcome.SUCCEEDED,
                                                                      t2: Outcome.SUCCEEDED}
    assert t3 not in store.state.outcomes and phases[t3] == Phase.PENDING  # still its own pod's to run
    assert [t.id for t in core.handover(other).trials] == [t3]
    said = [r.getMessage() for r in caplog.records]
    assert said == [f"warm pod {mine}: ignored its {kind} event for trial {t3}, which was never handed to it"
                    for kind in ("start", "end")], said


def test_a_warm_pod_is_handed_max_handed_trials_in_its_life_then_closed() -> None:
    """The record of what a pod was handed stays within an annotation's size: a pod that was handed MAX_HANDED
    trials gets no new one (its hand-over closed, so it ends and a new warm pod takes the slot); the patch that
    hands trials over adds them to the record."""
    engine, store, batch, core = warm_reconciler(concurrency={"max_parallel": 1})
    engine.reconcile(store.load("s"))
    core.start_pod(batch.jobs[batch.creates[0]], "w-1")
    trials = plan(store.state.sweep).trials
    engine.reconcile(store.load("s"))
    assert core.pods["w-1"]["metadata"]["annotations"][HANDED_ANNOTATION] == " ".join(
        sorted(t.id for t in trials[:2]))
    full = Pod({"metadata": {"labels": {LABEL_WORKER: "k"}}, "status": {}}, core.pods["w-1"], None, [],
               handed=frozenset(f"old-{i}" for i in range(MAX_HANDED)))
    queue = {"k": list(trials)}
    assert plan_handovers("s", [full], queue, {}, set()) == {"w-1": Handover(sweep="s", closed=True)}
    assert queue["k"] == list(trials)  # still waiting, for another pod
    room = Pod(full.job, full.pod, None, [], handed=frozenset(list(full.handed)[1:]))
    assert [t.id for t in plan_handovers("s", [room], queue, {}, set())["w-1"].trials] == [trials[0].id]


def test_a_slot_kind_no_node_can_take_ends_each_of_its_trials_unschedulable_and_its_warm_job_goes() -> None:
    engine, store, batch, core = warm_reconciler(concurrency={"max_parallel": 1},
                                                 resources={"unschedulable_seconds": 60})
    engine.reconcile(store.load("s"))
    [name] = batch.creates
    core.start_pod(batch.jobs[name], "w-1", phase="Pending")
    message = "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."
    core.pods["w-1"]["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                                 "message": message, "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    status = engine.reconcile(store.load("s"))
    assert {store.state.outcomes[t.trial_id].outcome for t in status.trials} == {Outcome.UNSCHEDULABLE}
    assert status.done and status.has_failures and message in status.trials[2].reason  # all three, not two handed
    assert batch.deleted == [name] and batch.creates == [name]  # no other warm pod for the kind
