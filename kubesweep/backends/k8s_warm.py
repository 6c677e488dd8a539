"""Warm pods (`spec.warm_pods`): a sweep's one-node trials run in pods that each hold one GPU slot and run trial
after trial, instead of a pod per trial. `WarmPods` is the reconciler's part for them (`k8s_reconcile`).

A warm pod is a Job (`manifests.render_worker`) whose pod runs `kubesweep.jobs.worker`; the trials go to it in its
hand-over (the pod's annotation `kubesweep.io/handover`, read in the pod through the downward API) and come back as
event lines in its log (`kubesweep.wire.handover`). Nothing else is kept: where a trial stands is read off the
cluster each step, like a Job's, so any process that follows the sweep (another shell, the operator after a
restart) reads the same.

A pod's events count for the trials it was handed alone: each hand-over's patch also adds its trials' ids to the
pod's record of all it was ever handed (`kubesweep.io/handed`, kept in this process too, so that a cache a patch
behind never shrinks it). An event of a pod naming a trial not handed to it (a trial that found a way to write one
for another) is ignored, and said once in the driver's log. A pod is handed `MAX_HANDED` trials at most in its life;
then its hand-over is closed and a new warm pod takes the slot.

A trial's state, from its warm pods (every pod of every warm Job of the sweep, live or ended):
- an `end` event: how it ended. An end the pod's termination caused (eviction, preemption, deletion: the worker
  says `the pod is terminating`) is no end: the trial is handed over again and resumes from its checkpoint. A
  failure is retried while the failures number at most `resources.retries`; OOM and GPU mismatch never are;
- a `start` without an end: Running while its pod lives; the pod gone or ended, the trial is handed over again,
  unless the pod was killed at its memory limit (the trial is OOM) or pods have ended under it more than
  `resources.retries + LOST_RUNS_ALLOWED` times without a word from their worker (failed);
- listed in a live pod's hand-over, not started: Pending, with its slot (it counts as started for the limits);
- otherwise Pending, waiting for a slot.
A slot kind whose every live pod no node can take (its GPU type on no node: `k8s_status.no_node_can_take`) for
`resources.unschedulable_seconds` ends each of its trials that has not ended `unschedulable`, and its warm Jobs are
deleted (`WarmPods.unschedulable_jobs`).

Each step hands over, to each live pod of a trial's slot kind (`manifests.worker_key`), the trials it still runs
plus up to `AHEAD` more, so the pod starts its next trial without waiting for a step; closes a pod's hand-over when
no trial of its kind is left, so the pod ends and gives its GPU back at once; and makes warm Jobs for what is left,
within `concurrency`. A trial is stopped by taking it out of its pod's hand-over; a trial running longer than
`resources.deadline_seconds` is recorded failed and taken out. A hand-over names each trial with its attempt (how
often it ended before), so a retried trial runs again even in the pod it failed in, and a pod replaced after an
eviction never reruns what its predecessor finished.

A trial that has a Job of its own stays with it (`WarmPods.runs`): a Sweep applied without `spec.warm_pods` before
warm pods were the default started its trials in Jobs of their own, and an operator of today must not hand those to
a warm pod as well.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kubesweep.backends.base import BackendError, Phase, TrialStatus
from kubesweep.backends.k8s_client import Api, api_error
from kubesweep.backends.k8s_kueue import Admission
from kubesweep.backends.k8s_state import Recorded, SweepState, phase_for
from kubesweep.backends.k8s_status import Observed, job_finished, unschedulable
from kubesweep.backends.k8s_watch import Obj
from kubesweep.manifests import LABEL_WORKER, render_worker, warm, worker_key
from kubesweep.plan import Plan, Trial
from kubesweep.sweep_spec import Sweep
from kubesweep.wire.env import TrackingEnv
from kubesweep.wire.handover import (
    EVENT_PREFIX,
    HANDED_ANNOTATION,
    HANDOVER_ANNOTATION,
    MAX_HANDED,
    HandedTrial,
    Handover,
    WorkerEvent,
    handed_annotation,
    handed_ids,
    log_lines,
    parse_events,
    read_handover,
    split_lines,
    unescape,
)
from kubesweep.wire.outcomes import Outcome

AHEAD = 1  # trials handed over beyond the one a pod runs
INTERRUPTED = "the pod is terminating"  # the worker's reason for an end its pod's termination caused
MERGE = "application/merge-patch+json"
NAME_PREFIX = 63 - len("-warm-") - 8 - 1 - 5  # the sweep's part of a warm Job's name
LOG_READ_S = 1.0  # a live pod's log is read at most this often
LOST_RUNS_ALLOWED = 2  # runs a pod may end under a trial, beyond its retries, before the trial is failed
MADE_GRACE_S = 60.0  # seconds a warm Job made here counts as held while no cache has shown it

log = logging.getLogger("kubesweep.backends.warm")


@dataclass
class Pod:
    """One warm pod as this step sees it: its Job and pod objects, its hand-over and its events so far."""

    job: Obj
    pod: Obj | None
    handover: Handover | None
    events: list[WorkerEvent]  # those naming no trial, or one handed to it
    newest: bool = True  # its Job's newest pod (an older one was replaced: evicted, or its worker failed)
    handed: frozenset[str] = frozenset()  # every trial id ever handed to it

    @property
    def key(self) -> str:
        return str(self.job["metadata"].get("labels", {}).get(LABEL_WORKER, ""))

    @property
    def name(self) -> str | None:
        return None if self.pod is None else str(self.pod["metadata"]["name"])

    @property
    def holds(self) -> bool:
        """Its Job holds a slot: unfinished and not being deleted."""
        return not job_finished(self.job) and not self.job["metadata"].get("deletionTimestamp")

    @property
    def live(self) -> bool:
        """Still able to run trials: its Job unfinished and not being deleted, its pod (if any yet) pending or
        running and not being deleted."""
        if not self.newest or not self.holds:
            return False
        if self.pod is None:
            return True
        return self.pod.get("status", {}).get("phase") in (None, "Pending", "Running") and not (
            self.pod["metadata"].get("deletionTimestamp"))


@dataclass
class Seen:
    """One warm trial's story across its pods."""

    ends: list[tuple[WorkerEvent, str]] = field(default_factory=list)  # (event, pod)
    starts: list[tuple[WorkerEvent, str]] = field(default_factory=list)


def _stories(pods: list[Pod]) -> dict[str, Seen]:
    stories: dict[str, Seen] = {}
    for pod in pods:
        for event in pod.events:
            if event.trial and event.event in ("start", "end"):
                seen = stories.setdefault(event.trial, Seen())
                (seen.starts if event.event == "start" else seen.ends).append((event, pod.name or ""))
    for seen in stories.values():
        seen.starts.sort(key=lambda e: e[0].at)
        seen.ends.sort(key=lambda e: e[0].at)
    return stories


def _counted_failures(seen: Seen) -> int:
    return sum(1 for e, _ in seen.ends if e.outcome == Outcome.FAILED.value and e.reason != INTERRUPTED)


def observe_warm(trial: Trial, seen: Seen | None, pods: list[Pod], retries: int,
                 listed: Mapping[str, Pod]) -> tuple[Observed, bool]:
    """What the warm pods say of `trial` (Observed, and whether it holds a slot), by the rules of the module's
    docstring; `listed`: trial id → the live pod whose hand-over lists it."""
    seen = seen or Seen()
    last_end = seen.ends[-1][0] if seen.ends else None
    last_start = seen.starts[-1] if seen.starts else None
    started_at = seen.starts[0][0].at if seen.starts else None
    live = {p.name: p for p in pods if p.live and p.name}
    if last_start is not None and (last_end is None or last_start[0].at > last_end.at):
        if last_start[1] in live:
            return Observed(Phase.RUNNING, started_at=last_start[0].at), True
        if any(p.name == last_start[1] and _oom_killed(p.pod) for p in pods):  # the memory limit: the trial's
            return Observed(Phase.FAILED, Outcome.OOM, "OOMKilled: over the pod's memory limit (exit code 137)",
                            started_at, last_start[0].at), True
        lost = len(seen.starts) - len(seen.ends)  # runs its pod ended under it without a word from its worker
        if lost > retries + LOST_RUNS_ALLOWED:  # a trial that takes its pod down with it must not run for ever
            return Observed(Phase.FAILED, Outcome.FAILED, f"its warm pod ended {lost} times while it ran",
                            started_at, last_start[0].at), True
        interrupted = "its warm pod ended while it ran"
    elif last_end is not None and last_end.reason != INTERRUPTED:
        outcome = _outcome(last_end.outcome)
        if outcome != Outcome.FAILED or _counted_failures(seen) > retries:
            reason = last_end.reason or ("" if outcome == Outcome.SUCCEEDED else f"exit code {last_end.exit_code}")
            return Observed(phase_for(outcome), outcome, reason, started_at, last_end.at), True
        interrupted = f"retrying after: exit code {last_end.exit_code}"
    else:
        interrupted = "its warm pod was stopped while it ran" if last_end is not None else ""
    if trial.id in listed:
        waiting = unschedulable(listed[trial.id].pod or {}, None, None)
        if waiting is not None:  # the scheduler's words, as for a trial's own pod
            return replace(waiting, started_at=started_at), True
        return Observed(Phase.PENDING, reason=interrupted or "handed to a warm pod", started_at=started_at), True
    return Observed(Phase.PENDING, reason=interrupted, started_at=started_at), False


def never_placed(pods: list[Pod], timeout: float, now: float) -> dict[str, Observed]:
    """Slot kind → how its trials end (`unschedulable`, the scheduler's reason), for each kind whose every live pod
    no node can take and has not for `timeout` seconds (`k8s_status.unschedulable`)."""
    ended: dict[str, Observed] = {}
    alive: dict[str, list[Observed | None]] = {}
    for pod in pods:
        if pod.live:
            alive.setdefault(pod.key, []).append(unschedulable(pod.pod, timeout, now) if pod.pod else None)
    for key, seen in alive.items():
        timed_out = [o for o in seen if o is not None and o.phase.terminal]
        if timed_out and len(timed_out) == len(seen):
            ended[key] = timed_out[0]
    return ended


def _oom_killed(pod: Obj | None) -> bool:
    """The pod's container was killed at its memory limit (the trial it ran then is the one that outgrew it)."""
    for status in (pod or {}).get("status", {}).get("containerStatuses") or []:
        for state in (status.get("state") or {}, status.get("lastState") or {}):
            if (state.get("terminated") or {}).get("reason") == "OOMKilled":
                return True
    return False


def _outcome(value: str | None) -> Outcome:
    try:
        return Outcome(value or Outcome.FAILED.value)
    except ValueError:  # text from a pod: anything else is a failure
        return Outcome.FAILED


def attempt_of(seen: Seen | None) -> int:
    """A trial's next attempt: how often it has ended before, in any pod."""
    return len(seen.ends) if seen else 0


def plan_handovers(sweep: str, pods: list[Pod], waiting: Mapping[str, list[Trial]], stories: Mapping[str, Seen],
                   settled: set[str]) -> dict[str, Handover]:
    """Each live pod's hand-over after this step: what it still runs (listed, neither ended there nor settled),
    topped up from `waiting` (the pending trials of each slot kind, in plan order; taken from) to `1 + AHEAD`,
    closed when none of its kind is left."""
    out: dict[str, Handover] = {}
    for pod in pods:
        if not pod.live or pod.name is None:
            continue
        keep = [t for t in (pod.handover.trials if pod.handover else [])
                if t.id not in settled and attempt_of(stories.get(t.id)) <= t.attempt]  # not ended yet
        queue = waiting.get(pod.key, [])
        handed = set(pod.handed)
        full = False
        while len(keep) < 1 + AHEAD and queue:
            if queue[0].id not in handed and len(handed) >= MAX_HANDED:
                full = True  # its record is full: it ends once it has run what it holds, a new pod takes over
                break
            trial = queue.pop(0)
            handed.add(trial.id)
            config = trial.config.model_dump(mode="json", by_alias=True)
            keep.append(HandedTrial(id=trial.id, config=config, attempt=attempt_of(stories.get(trial.id))))
        out[pod.name] = Handover(sweep=sweep, trials=keep, closed=full or not queue)
    return out


class WorkerLogs:
    """The events in warm pods' logs, read through the logs API: a live pod's at most every `LOG_READ_S`, an
    ended pod's once more after it ended, then kept."""

    def __init__(self, api: Api, every: float = LOG_READ_S) -> None:
        self.api = api
        self.every = every
        self._read: dict[str, tuple[float, bool, list[WorkerEvent]]] = {}  # pod uid -> (when, final, events)

    def events(self, pod: Obj) -> list[WorkerEvent]:
        meta = pod["metadata"]
        uid = str(meta.get("uid") or meta["name"])
        final = pod.get("status", {}).get("phase") in ("Succeeded", "Failed")
        now = time.monotonic()
        cached = self._read.get(uid)
        if cached is not None and (cached[1] or (not final and now - cached[0] < self.every)):
            return cached[2]
        text = self.text(str(meta["name"]))
        if text is None:
            return cached[2] if cached else []
        events = parse_events(log_lines(text))
        self._read[uid] = (now, final, events)
        return events

    def text(self, pod: str) -> str | None:
        """The pod's log; None when it has none to give (not started, or gone)."""
        try:
            return str(self.api.core.read_namespaced_pod_log(pod, self.api.namespace))
        except self.api.ApiException:  # 400: its container has not started; 404: the pod is gone
            return None
        except BackendError:
            return None

    def forget(self, live_uids: set[str]) -> None:
        self._read = {k: v for k, v in self._read.items() if k in live_uids}


Apply = Callable[[list[dict[str, Any]]], None]


class WarmPods:
    """The reconciler's part for warm trials: observe them, hand them over, make warm Jobs, stop them."""

    def __init__(self, api: Api, *, create: Apply, protect: Callable[[dict[str, Any]], None]) -> None:
        self.api = api
        self.create = create
        self.protect = protect
        self.logs = WorkerLogs(api)
        self._made: dict[str, dict[str, tuple[str, float]]] = {}  # sweep -> warm Job -> (slot kind, made when)
        self._pods: dict[str, list[Pod]] = {}  # sweep -> its warm pods as the last `observe` read them
        self._own: dict[str, set[str]] = {}  # sweep -> its trials with a Job of their own, as `observe` was told
        self._handed: dict[str, set[str]] = {}  # pod uid -> the trial ids this process has handed to it
        self._ignored: set[tuple[str, str, str]] = set()  # (pod uid, event, trial) said in the log already
        self._never: dict[str, list[Obj]] = {}  # sweep -> its warm Jobs of kinds no node can take (`never_placed`)

    def runs(self, trial: Trial, sweep: Sweep) -> bool:
        """Whether a warm pod runs the trial: the sweep asks for warm pods, the trial fits one pod, and it has no
        Job of its own (one made before the sweep ran in warm pods keeps it)."""
        return warm(trial, sweep) and trial.id not in self._own.get(sweep.name, ())

    # -- observing ------------------------------------------------------------------------------------------

    def pods(self, jobs: list[Obj], pods: list[Obj]) -> list[Pod]:
        """The sweep's warm pods: each warm Job with each of its pods (the newest first), or alone while it has
        none."""
        workers = [j for j in jobs if j["metadata"].get("labels", {}).get(LABEL_WORKER)]
        by_owner: dict[str, list[Obj]] = {}
        for pod in pods:
            for ref in pod["metadata"].get("ownerReferences") or []:
                by_owner.setdefault(str(ref.get("uid")), []).append(pod)
        out = []
        for job in workers:
            mine = sorted(by_owner.get(str(job["metadata"].get("uid")), []),
                          key=lambda p: p["metadata"].get("creationTimestamp") or "", reverse=True)
            if not mine:
                out.append(Pod(job, None, None, []))
            for i, pod in enumerate(mine):
                handover = _handover_of(pod)
                handed = _handed_to(pod, handover) | self._handed.get(_uid(pod), set())
                out.append(Pod(job, pod, handover, self._theirs(pod, handed, self.logs.events(pod)),
                               newest=i == 0, handed=frozenset(handed)))
        return out

    def _theirs(self, pod: Obj, handed: set[str], events: list[WorkerEvent]) -> list[WorkerEvent]:
        """The pod's events that name no trial or one handed to it; any other is said once in the log, as data."""
        out = []
        for event in events:
            if event.trial is None or event.trial in handed:
                out.append(event)
                continue
            said = (_uid(pod), event.event, event.trial)
            if said not in self._ignored:
                self._ignored.add(said)
                log.warning("warm pod %s: ignored its %s event for trial %s, which was never handed to it",
                            pod["metadata"]["name"], event.event, event.trial)
        return out

    def observe(self, state: SweepState, p: Plan, jobs: list[Obj], pods: list[Obj],
                queued: Mapping[str, Admission] | None = None, own: Iterable[str] = ()
                ) -> dict[str, tuple[Observed, bool]]:
        """trial id → (what the warm pods say, whether it holds a slot), for the sweep's warm trials. `queued`:
        slot kind → Kueue's word on a suspended warm Job of that kind, which a trial of the kind that no pod has
        been handed yet waits for (in Kueue's words, as a trial's own Job would); `own`: the trials that have a Job
        of their own (not warm trials, until the next `observe`)."""
        sweep = state.sweep
        self._own[sweep.name] = set(own)
        found = self._pods[sweep.name] = self.pods(jobs, pods)
        stories = _stories(found)
        listed = {t.id: pod for pod in found if pod.live and pod.handover for t in pod.handover.trials}
        retries = sweep.spec.resources.retries
        placed_never = never_placed(found, sweep.spec.resources.unschedulable_seconds, time.time())
        self._never[sweep.name] = [p.job for p in found if p.key in placed_never]
        out = {}
        for trial in p.trials:
            if not self.runs(trial, sweep):
                continue
            seen, holds = observe_warm(trial, stories.get(trial.id), found, retries, listed)
            ended = placed_never.get(worker_key(trial))
            if ended is not None and not seen.phase.terminal and seen.phase != Phase.RUNNING:
                seen, holds = replace(ended, started_at=seen.started_at), True
            word = (queued or {}).get(worker_key(trial))
            if word is not None and seen.phase == Phase.PENDING and trial.id not in listed:
                seen = replace(seen, reason=f"{seen.reason}; {word.reason}" if seen.reason else word.reason)
            out[trial.id] = (seen, holds)
        return out

    def unschedulable_jobs(self, sweep: str) -> list[Obj]:
        """The sweep's warm Jobs whose slot kind no node can take, as the last `observe` read them: once their
        trials are recorded `unschedulable`, they are deleted (their pods would wait for ever)."""
        return list(self._never.get(sweep, []))

    def held(self, sweep: str) -> list[str]:
        """The slot kind of each slot the sweep's warm pods hold: each warm Job that is unfinished and not being
        deleted (whether its pod runs, is yet to come, or is being replaced), as the last `observe` read them, and
        the warm Jobs made here that no cache shows yet."""
        found = self._pods.get(sweep, [])
        jobs = {p.job["metadata"]["name"]: p for p in found}
        made = self._made.get(sweep, {})
        now = time.monotonic()
        for name in [n for n, (_, at) in made.items() if n in jobs or now - at > MADE_GRACE_S]:
            del made[name]
        return [p.key for p in jobs.values() if p.holds] + [key for key, _ in made.values()]

    # -- driving --------------------------------------------------------------------------------------------

    def step(self, state: SweepState, p: Plan, statuses: list[TrialStatus], room: int,
             per_type: dict[str | None, int], *, image: str, tracking: TrackingEnv | None,
             owner: Mapping[str, Any] | None, queued_at: float | None) -> int:
        """Hand over, and make the warm Jobs the limits allow: `room` more slots (warm pods and trial Jobs
        together); `per_type`: the slots each GPU type holds (updated). Returns how many warm Jobs it made."""
        sweep = state.sweep
        found = self._pods.get(sweep.name, [])
        stories = _stories(found)
        trials = p.by_id()
        settled = {s.trial_id for s in statuses if s.phase.terminal} | set(state.outcomes)  # recorded: stop it
        waiting: dict[str, list[Trial]] = {}
        for s in statuses:
            trial = trials[s.trial_id]
            if s.phase == Phase.PENDING and not s.attempts and self.runs(trial, sweep):
                waiting.setdefault(worker_key(trial), []).append(trial)
        handovers = plan_handovers(sweep.name, found, waiting, stories, settled)
        for pod in found:
            if pod.name in handovers and handovers[pod.name] != pod.handover:
                self.hand_over(pod, handovers[pod.name])
        made: list[dict[str, Any]] = []
        limit = sweep.spec.concurrency.per_gpu_type
        for key, queue in waiting.items():
            for trial in list(queue):
                if room <= 0 or (limit and trial.gpu and per_type.get(trial.gpu, 0) >= limit):
                    break
                name = self._name(sweep.name, key)
                job = render_worker(trial, sweep, name=name, image=image, namespace=self.api.namespace,
                                    tracking=tracking, owner=owner, queued_at=queued_at)
                self.protect(job)
                made.append(job)
                self._made.setdefault(sweep.name, {})[name] = (key, time.monotonic())
                room -= 1
                per_type[trial.gpu] = per_type.get(trial.gpu, 0) + 1
                queue.pop(0)  # one trial's worth of slot; the pod gets its hand-over once it exists
        if made:
            self.create(made)
        return len(made)

    def overdue(self, state: SweepState, p: Plan, statuses: list[TrialStatus], now: float) -> dict[str, Recorded]:
        """Warm trials running longer than the deadline, recorded failed (not yet recorded: the next step takes
        them out of their pods' hand-overs, which stops them)."""
        deadline = state.sweep.spec.resources.deadline_seconds
        trials = p.by_id()
        return {s.trial_id: Recorded(Outcome.FAILED, f"deadline exceeded after {deadline} s", s.started_at, now)
                for s in statuses
                if s.phase == Phase.RUNNING and s.started_at is not None and now - s.started_at > deadline
                and s.trial_id not in state.outcomes and self.runs(trials[s.trial_id], state.sweep)}

    def hand_over(self, pod: Pod, handover: Handover) -> None:
        """Patch the pod's hand-over, and add its trials to the pod's record of what it was handed (here first:
        an event of a trial may come before the cache shows the patch)."""
        assert pod.pod is not None and pod.name is not None
        handed = self._handed.setdefault(_uid(pod.pod), set())
        handed.update(pod.handed, (t.id for t in handover.trials))
        body = {"metadata": {"annotations": {HANDOVER_ANNOTATION: handover.to_annotation(),
                                             HANDED_ANNOTATION: handed_annotation(handed)}}}
        with contextlib.suppress(self.api.ApiException):  # 404: the pod is gone; the next step sees it
            self.api.write(self._patch_pod, pod.name, self.api.namespace, body, _content_type=MERGE,
                           _preload_content=False)

    def _patch_pod(self, *args: Any, **kwargs: Any) -> Any:
        """The hand-over's patch; refused for want of the right, it says what warm pods need and the way out."""
        try:
            return self.api.core.patch_namespaced_pod(*args, **kwargs)
        except self.api.ApiException as exc:
            if getattr(exc, "status", None) != 403:
                raise
            raise BackendError(f"{api_error(exc)}; warm pods (spec.warm_pods, the default) are handed their trials "
                               f"by a patch of the pod, which needs `patch` on pods in namespace "
                               f"{self.api.namespace!r}: grant it, or set spec.warm_pods: false for a pod per "
                               "trial") from None

    def stop(self, sweep: str, trial_id: str) -> None:
        """Take a trial out of the hand-over of every live pod that lists it (its worker stops it)."""
        for pod in self._pods.get(sweep, []):
            if pod.live and pod.name and pod.handover and any(t.id == trial_id for t in pod.handover.trials):
                self.hand_over(pod, Handover(sweep=sweep, closed=pod.handover.closed,
                                                  trials=[t for t in pod.handover.trials if t.id != trial_id]))

    def warm_jobs(self, jobs: list[Obj]) -> list[Obj]:
        return [j for j in jobs if j["metadata"].get("labels", {}).get(LABEL_WORKER)]

    def forget(self, sweep: str) -> None:
        self._own.pop(sweep, None)
        self._never.pop(sweep, None)
        self._made.pop(sweep, None)
        for pod in self._pods.pop(sweep, []):
            if pod.pod is not None:
                uid = _uid(pod.pod)
                self._handed.pop(uid, None)
                self._ignored = {s for s in self._ignored if s[0] != uid}

    @staticmethod
    def _name(sweep: str, key: str) -> str:
        digest = hashlib.sha256(f"{sweep}/{key}".encode()).hexdigest()[:8]
        return f"{sweep[:NAME_PREFIX].rstrip('-')}-warm-{digest}-{os.urandom(3).hex()[:5]}"

def warm_trial_log(api: Api, pods: list[Obj], trial: TrialStatus, follow: bool) -> Iterator[str]:
    """The trial's own lines from the log of the warm pod it last started in (among `pods`, the sweep's, those it
    was handed to), unescaped; `follow`: as they come, until the trial ends there."""
    workers = sorted((p for p in pods if p["metadata"].get("labels", {}).get(LABEL_WORKER)
                      and trial.trial_id in _handed_to(p, _handover_of(p))),
                     key=lambda p: p["metadata"].get("creationTimestamp") or "", reverse=True)
    for pod in workers:
        name = str(pod["metadata"]["name"])
        try:
            text = str(api.core.read_namespaced_pod_log(name, api.namespace))
        except api.ApiException:  # not started, or gone
            continue
        lines = log_lines(text)
        if not any(line.startswith(EVENT_PREFIX) and _is_start(line, trial.trial_id) for line in lines):
            continue
        if not follow or _ended(lines, trial.trial_id):
            yield "".join(line + "\n" for line in slice_trial(lines, trial.trial_id))
            return
        try:
            resp = api.core.read_namespaced_pod_log(name, api.namespace, follow=True, _preload_content=False)
            yield from _follow_slice(resp.stream(4096), trial.trial_id)
        except api.ApiException as exc:
            raise BackendError(f"cannot read the log of pod {name}: {api_error(exc)}") from None
        return
    raise BackendError(f"trial {trial.name} has not started in a warm pod ({trial.phase.value}"
                       f"{': ' + trial.reason if trial.reason else ''}); no log yet")


def _is_start(line: str, trial: str) -> bool:
    events = parse_events([line])
    return bool(events) and events[0].event == "start" and events[0].trial == trial


def _ended(lines: list[str], trial: str) -> bool:
    return any(e.event == "end" and e.trial == trial for e in parse_events(lines))


def _follow_slice(chunks: Iterator[bytes], trial: str) -> Iterator[str]:
    """The trial's lines of a followed pod log, from its last start (`slice_trial`, line by line) to its end."""
    buffered, inside = "", False
    for chunk in chunks:
        buffered += chunk.decode(errors="replace")
        complete, buffered = split_lines(buffered)
        for line in complete:
            events = parse_events([line])
            event = events[0] if events and events[0].trial == trial else None
            if event is not None and event.event == "start":
                inside = True
            elif event is not None and event.event == "end" and inside:
                return
            elif inside and not events:
                yield unescape(line) + "\n"


def slice_trial(lines: list[str], trial: str) -> list[str]:
    """A trial's own lines in a warm pod's log: those between its last start event and its end, unescaped."""
    out: list[str] = []
    inside = False
    for line in lines:
        event = parse_events([line])
        if event and event[0].trial == trial and event[0].event == "start":
            out, inside = [], True
        elif event and event[0].trial == trial and event[0].event == "end":
            inside = False
        elif inside and not event:
            out.append(unescape(line))
    return out


def _uid(pod: Obj) -> str:
    return str(pod["metadata"].get("uid") or pod["metadata"]["name"])


def _handed_to(pod: Obj, handover: Handover | None) -> set[str]:
    """The trial ids the pod's record says it was handed, and those its hand-over lists now."""
    text = (pod["metadata"].get("annotations") or {}).get(HANDED_ANNOTATION)
    return set(handed_ids(text if isinstance(text, str) else None)) | {t.id for t in (handover.trials if handover
                                                                                     else [])}


def _handover_of(pod: Obj) -> Handover | None:
    text = (pod["metadata"].get("annotations") or {}).get(HANDOVER_ANNOTATION)
    if not text:
        return None
    with contextlib.suppress(ValueError):
        return read_handover(text)
    return None

