"""Trial → Kubernetes manifests. Pure functions: no cluster, no client library.

One renderer serves `sweep render`, the Kubernetes backend and the operator. A trial becomes a `batch/v1` Job:

- image pinned by digest (a tag is refused unless allowed); command and args as lists, never a shell;
- `nvidia.com/gpu` limits, cpu/memory requests = limits, a nodeSelector on the catalog's exact
  `nvidia.com/gpu.product` label, a toleration for the `nvidia.com/gpu` taint;
- the trial's resolved config as a pod annotation, mounted into the container through the downward API;
- PodSecurity `restricted`: non-root, no privilege escalation, all capabilities dropped, seccomp RuntimeDefault,
  read-only root filesystem with scratch volumes for /tmp, /cache, the output and `/dev/shm`;
- a podFailurePolicy: disruptions (preemption, eviction, node drain) don't count against the trial, an OOM (the
  job's exit 3, or the container killed at its memory limit: 137) or a GPU mismatch (exit 4) fails the Job at once
  instead of retrying;
- more than one GPU: one pod running torchrun; more than one node: an Indexed Job plus a headless Service.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from kubesweep.gpus import GPU_RESOURCE, PRODUCT_LABEL, Catalog, load_catalog
from kubesweep.images.lock import LockError, lock_keys
from kubesweep.jobs.command import (
    CHECKPOINT_DIR_ENV,
    CHECKPOINT_ROOT_ENV,
    PRIORITY_CLASS_ENV,
    QUEUE_ENV,
    QUEUED_AT_ENV,
    SWEEP_ENV,
    TRIAL_ID_ENV,
    WORKER_MODULE,
    job_argv,
)
from kubesweep.plan import Plan, Trial
from kubesweep.sweep_spec import DIGEST_RE, Sweep
from kubesweep.wire.env import TrackingEnv
from kubesweep.wire.handover import HANDOVER_ANNOTATION, HANDOVER_FILE
from kubesweep.wire.outcomes import ExitCode

GROUP = "kubesweep.io"
LABEL_SWEEP = f"{GROUP}/sweep"
LABEL_TRIAL = f"{GROUP}/trial"
# Kueue's labels on a Job it admits: the LocalQueue it waits in, and the WorkloadPriorityClass that orders it.
KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY = "kueue.x-k8s.io/priority-class"
ANNOTATION_CONFIG = f"{GROUP}/trial-config"
ANNOTATION_LABEL = f"{GROUP}/cell"
FIELD_MANAGER = "kubesweep"
CONTAINER = "job"
CONFIG_DIR = "/etc/kubesweep"
OUTPUT_DIR = "/workspace/output"
CACHE_DIR = "/cache"
CHECKPOINT_DIR = "/checkpoints"
RDZV_PORT = 29500
RUN_AS = 1000
SIGKILL_EXIT = 128 + 9  # how a container killed for exceeding its memory limit exits


# Finished Jobs that carry no finalizer (direct backend, tuner, the tuner's own Job) are kept at least this long,
# whatever the spec's ttl_seconds_after_finished, so whoever follows them records their outcomes before the TTL
# controller deletes them.
UNGUARDED_TTL_FLOOR = 600


class RenderError(ValueError):
    pass


def sweep_labels(sweep: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "kubesweep",
        "app.kubernetes.io/component": "trial",
        "app.kubernetes.io/managed-by": "kubesweep",
        "app.kubernetes.io/part-of": sweep[:63],
        LABEL_SWEEP: sweep[:63],
    }


def trial_labels(trial: Trial) -> dict[str, str]:
    labels = {**sweep_labels(trial.config.sweep), LABEL_TRIAL: trial.id,
              f"{GROUP}/precision": trial.job.precision, f"{GROUP}/batch-size": str(trial.job.batch_size),
              f"{GROUP}/compile": str(trial.job.compile or "off"), f"{GROUP}/repeat": str(trial.repeat)}
    if trial.gpu:
        labels[f"{GROUP}/gpu"] = trial.gpu
    return labels


def image_problem(sweep: Sweep, *, allow_unpinned: bool = False) -> str | None:
    """Why the sweep's trials have no image to run as on Kubernetes (the problem is at `spec.image`), or None: no
    image named, a key of the image lock that is not built yet, a reference not pinned by digest."""
    try:
        image = sweep.image_reference()
    except LockError as exc:  # a key of the lock without a confirmed digest: not built (and pushed) yet
        return str(exc)
    if not image:
        keys = ", ".join(lock_keys()) or "none"
        return ("required to run trials on Kubernetes: name a key of the image lock (" + keys + "; "
                "`make images REGISTRY=<your registry>` builds them) or a reference pinned by digest, "
                "NAME@sha256:<64 hex> (see images/README.md)")
    if not allow_unpinned and not DIGEST_RE.match(image):
        return f"image {image!r} is not pinned by digest; pass --allow-unpinned to use it"
    return None


def resolve_image(sweep: Sweep, *, allow_unpinned: bool = False) -> str:
    """The job image of the sweep's trials; `RenderError` naming the spec when it has none to run
    (`image_problem`)."""
    problem = image_problem(sweep, allow_unpinned=allow_unpinned)
    if problem is not None:
        raise RenderError(f"{sweep.source}: spec.image: {problem}")
    return sweep.image_reference() or ""


def trial_command(trial: Trial, rendezvous: Rendezvous) -> list[str]:
    """The container's command: the job (torchrun in front of it for more than one GPU or node)."""
    return job_argv(f"{CONFIG_DIR}/trial.json", OUTPUT_DIR, python="python", gpus=max(trial.gpus_per_trial, 1),
                    num_nodes=trial.num_nodes, rdzv_endpoint=rendezvous.endpoint)


def trial_resources(trial: Trial, sweep: Sweep) -> dict[str, Any]:
    """The container's resources: cpu, memory and GPUs, requests equal to limits."""
    res = sweep.spec.resources
    limits: dict[str, str] = {"cpu": res.cpu, "memory": res.memory}
    if trial.gpus_per_trial:
        limits[GPU_RESOURCE] = str(trial.gpus_per_trial)
    return {"requests": dict(limits), "limits": limits}


def trial_env(trial: Trial, sweep: Sweep, *, image: str, tracking: TrackingEnv | None,
              queued_at: float | None = None) -> list[dict[str, Any]]:
    """The container's environment: the trial's identity, cache locations, tracking, the checkpoint directory, and
    (a queued trial) its Kueue queue and priority class and when its Job was created, from which the job measures
    its wait for admission."""
    env: list[dict[str, Any]] = [
        {"name": SWEEP_ENV, "value": trial.config.sweep},
        {"name": TRIAL_ID_ENV, "value": trial.id},
        {"name": "KUBESWEEP_IMAGE", "value": image},
        {"name": "KUBESWEEP_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "KUBESWEEP_TERMINATION_LOG", "value": "/dev/termination-log"},
        {"name": "HF_HOME", "value": f"{CACHE_DIR}/huggingface"},
        {"name": "TORCHINDUCTOR_CACHE_DIR", "value": f"{CACHE_DIR}/inductor"},
        {"name": "TRITON_CACHE_DIR", "value": f"{CACHE_DIR}/triton"},
        {"name": "HOME", "value": "/tmp"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        *(tracking.env() if tracking else []),
    ]
    if queued_at is not None:
        env.append({"name": QUEUED_AT_ENV, "value": f"{queued_at:.3f}"})
    for name, value in ((QUEUE_ENV, sweep.spec.queue), (PRIORITY_CLASS_ENV, sweep.spec.priority_class)):
        if value:
            env.append({"name": name, "value": value})
    if sweep.spec.storage.checkpoint_claim:
        env.append({"name": CHECKPOINT_DIR_ENV, "value": f"{CHECKPOINT_DIR}/{trial.config.sweep}/{trial.id}"})
    return env


def trial_volumes(sweep: Sweep) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The container's volume mounts and the pod's volumes: the trial config (from the pod annotation), scratch
    space for the output, the cache (a claim when the spec names one), /tmp and /dev/shm, and the checkpoint claim."""
    storage = sweep.spec.storage
    mounts: list[dict[str, Any]] = [
        {"name": "trial-config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "output", "mountPath": OUTPUT_DIR},
        {"name": "cache", "mountPath": CACHE_DIR},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "trial-config", "downwardAPI": {"items": [
            {"path": "trial.json", "fieldRef": {"fieldPath": f"metadata.annotations['{ANNOTATION_CONFIG}']"}}]}},
        {"name": "output", "emptyDir": {}},
        {"name": "cache", **({"persistentVolumeClaim": {"claimName": storage.cache_claim}}
                             if storage.cache_claim else {"emptyDir": {}})},
        {"name": "tmp", "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": sweep.spec.resources.shm_size}},
    ]
    if storage.checkpoint_claim:
        mounts.append({"name": "checkpoints", "mountPath": CHECKPOINT_DIR})
        volumes.append({"name": "checkpoints", "persistentVolumeClaim": {"claimName": storage.checkpoint_claim}})
    return mounts, volumes


# The labels every trial pod of kubesweep carries; the namespace is the pod's own (no namespaceSelector), so one
# namespace's sweeps cannot keep another namespace's pods off a node.
ALONE_SELECTOR = ("app.kubernetes.io/component", "app.kubernetes.io/managed-by")
HOSTNAME_LABEL = "kubernetes.io/hostname"


def trial_placement(trial: Trial, catalog: Catalog, *, alone: bool = False) -> dict[str, Any]:
    """Where the pod may run: a GPU trial on nodes of its exact GPU product, tolerating the GPU taint; `alone`
    (spec.placement.alone): on a node where no other trial pod of the namespace runs, and none comes while it
    runs (required anti-affinity is symmetric: the scheduler keeps other trials off a node this pod is on)."""
    placement: dict[str, Any] = {}
    if alone:
        trial_pods = {k: v for k, v in sweep_labels("").items() if k in ALONE_SELECTOR}
        placement["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": trial_pods}, "topologyKey": HOSTNAME_LABEL}]}}
    if trial.gpu:
        placement["nodeSelector"] = {PRODUCT_LABEL: catalog[trial.gpu].product}
    if trial.gpus_per_trial:
        placement["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    return placement


@dataclass(frozen=True)
class Rendezvous:
    """What a multi-node trial adds for torchrun's rendezvous (nothing for one node): the endpoint, pod 0 of the
    Indexed Job by its DNS name under the headless Service (`render_rendezvous_service`); the container's port; the
    pod's subdomain; and the Job's completion mode, one completion per node."""

    endpoint: str | None = None
    container: dict[str, Any] = field(default_factory=dict)
    pod: dict[str, Any] = field(default_factory=dict)
    job: dict[str, Any] = field(default_factory=dict)


def trial_rendezvous(trial: Trial) -> Rendezvous:
    nodes = trial.num_nodes
    if nodes <= 1:
        return Rendezvous()
    return Rendezvous(endpoint=f"{trial.name}-0.{trial.name}:{RDZV_PORT}",
                      container={"ports": [{"name": "rdzv", "containerPort": RDZV_PORT}]},
                      pod={"subdomain": trial.name},
                      job={"completionMode": "Indexed", "completions": nodes, "parallelism": nodes})


def trial_failure_policy() -> dict[str, Any]:
    """The Job's podFailurePolicy.

    Rules apply in order. A disrupted pod (evicted, preempted, drained) is replaced whatever its exit code, without
    counting against backoffLimit. Then an OOM fails the Job at once: the job's own exit 3 (CUDA out of memory) or
    137, the SIGKILL a container gets when it exceeds its memory limit (a SIGKILL after an eviction's grace period
    carries DisruptionTarget and matched the first rule). Retrying either would only run out of memory again; so
    would a GPU mismatch (4)."""
    return {"rules": [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "FailJob",
         "onExitCodes": {"containerName": CONTAINER, "operator": "In",
                         "values": [int(ExitCode.OOM), int(ExitCode.GPU_MISMATCH), SIGKILL_EXIT]}},
    ]}


def restricted_container_security() -> dict[str, Any]:
    """A trial container's securityContext (PodSecurity `restricted`, read-only root filesystem)."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def restricted_pod_security() -> dict[str, Any]:
    """A trial pod's securityContext: kubesweep's non-root user and group, seccomp RuntimeDefault."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "fsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _object_metadata(name: str, labels: dict[str, str], *, annotations: dict[str, str] | None = None,
                     namespace: str | None = None, owner: Mapping[str, Any] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": labels}
    if annotations is not None:
        metadata["annotations"] = annotations
    if namespace:
        metadata["namespace"] = namespace
    if owner:
        metadata["ownerReferences"] = [dict(owner)]
    return metadata


def render_job(trial: Trial, sweep: Sweep, *, image: str, namespace: str | None = None,
               tracking: TrackingEnv | None = None, owner: Mapping[str, Any] | None = None,
               catalog: Catalog | None = None, extra_annotations: Mapping[str, str] | None = None,
               queued_at: float | None = None) -> dict[str, Any]:
    """A trial's Job, composed of the builders above; `queued_at`: when it is created (a sweep with spec.queue),
    for the trial's queue wait."""
    labels = trial_labels(trial)
    config_json = json.dumps(trial.config.model_dump(mode="json", by_alias=True), sort_keys=True)
    annotations = {ANNOTATION_CONFIG: config_json, ANNOTATION_LABEL: trial.label(), **(extra_annotations or {})}
    rendezvous = trial_rendezvous(trial)
    mounts, volumes = trial_volumes(sweep)
    env = trial_env(trial, sweep, image=image, tracking=tracking, queued_at=queued_at)
    return _job(trial, sweep, name=trial.name, labels=labels, annotations=annotations,
                command=trial_command(trial, rendezvous), env=env, mounts=mounts, volumes=volumes,
                rendezvous=rendezvous, deadline=sweep.spec.resources.deadline_seconds, image=image,
                namespace=namespace, owner=owner, catalog=catalog)


def _job(trial: Trial, sweep: Sweep, *, name: str, labels: dict[str, str], annotations: dict[str, str],
         command: list[str], env: list[dict[str, Any]], mounts: list[dict[str, Any]], volumes: list[dict[str, Any]],
         rendezvous: Rendezvous, deadline: int | None, image: str, namespace: str | None,
         owner: Mapping[str, Any] | None, catalog: Catalog | None) -> dict[str, Any]:
    """The Job around one container running `command`: resources and placement of `trial`'s kind, restricted
    security, the failure policy, the queue's labels and suspension."""
    catalog = catalog or load_catalog()
    spec = sweep.spec
    res = spec.resources
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "env": env,
        "resources": trial_resources(trial, sweep),
        "volumeMounts": mounts,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": restricted_container_security(),
        **rendezvous.container,
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": volumes,
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": restricted_pod_security(),
        **({"serviceAccountName": spec.service_account} if spec.service_account else {}),
        **trial_placement(trial, catalog, alone=spec.placement.alone),
        **rendezvous.pod,
    }
    job_spec: dict[str, Any] = {
        "backoffLimit": res.retries,
        **({"activeDeadlineSeconds": deadline} if deadline is not None else {}),
        "ttlSecondsAfterFinished": res.ttl_seconds_after_finished,
        "podFailurePolicy": trial_failure_policy(),
        "template": {"metadata": {"labels": dict(labels), "annotations": annotations}, "spec": pod_spec},
        **rendezvous.job,
    }
    cell = {ANNOTATION_LABEL: annotations[ANNOTATION_LABEL]} if ANNOTATION_LABEL in annotations else {}
    metadata = _object_metadata(name, {**labels, **queue_labels(sweep)}, annotations=cell, namespace=namespace,
                                owner=owner)
    if spec.queue:  # created suspended: Kueue starts it when the queue's quota admits it
        job_spec["suspend"] = True
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": job_spec}


# A warm pod (spec.warm_pods): a Job per GPU slot whose pod runs `kubesweep.jobs.worker`, which runs the trials
# handed over to it one after another (kubesweep/wire/handover.py).
LABEL_WORKER = f"{GROUP}/worker"  # on a warm pod's Job and pod: the slot kind it runs trials of (`worker_key`)


def warm(trial: Trial, sweep: Sweep) -> bool:
    """Whether the trial runs in a warm pod: the sweep asks for them and the trial fits one pod."""
    return sweep.spec.warm_pods and trial.num_nodes <= 1


def worker_key(trial: Trial) -> str:
    """The kind of slot a trial needs, which a warm pod is made for: its GPU type and count (a label value)."""
    return f"{(trial.gpu or 'any').lower()}-{trial.gpus_per_trial}"[:63]


def render_worker(trial: Trial, sweep: Sweep, *, name: str, image: str, namespace: str | None = None,
                  tracking: TrackingEnv | None = None, owner: Mapping[str, Any] | None = None,
                  catalog: Catalog | None = None, extra_annotations: Mapping[str, str] | None = None,
                  queued_at: float | None = None) -> dict[str, Any]:
    """A warm pod's Job, for trials of `trial`'s slot kind (`worker_key`): the trial Job's resources, placement,
    security, volumes and failure policy; its command the worker, its config the hand-over (the pod's annotation
    `kubesweep.io/handover`, written by the driver, read through the downward API); each trial's id and checkpoint
    directory set by the worker. No activeDeadlineSeconds: the deadline is each trial's, kept by the driver."""
    labels = {**sweep_labels(sweep.name), LABEL_WORKER: worker_key(trial)}
    if trial.gpu:
        labels[f"{GROUP}/gpu"] = trial.gpu
    mounts, volumes = trial_volumes(sweep)
    for volume in volumes:
        if volume["name"] == "trial-config":
            volume["downwardAPI"] = {"items": [
                {"path": HANDOVER_FILE, "fieldRef": {"fieldPath": f"metadata.annotations['{HANDOVER_ANNOTATION}']"}}]}
    env = [e for e in trial_env(trial, sweep, image=image, tracking=tracking, queued_at=queued_at)
           if e["name"] not in (TRIAL_ID_ENV, CHECKPOINT_DIR_ENV)]
    if sweep.spec.storage.checkpoint_claim:
        env.append({"name": CHECKPOINT_ROOT_ENV, "value": CHECKPOINT_DIR})
    command = ["python", "-m", WORKER_MODULE, "--handover", f"{CONFIG_DIR}/{HANDOVER_FILE}", "--output-dir",
               OUTPUT_DIR, "--sweep", sweep.name]
    annotations = {ANNOTATION_LABEL: f"warm pod for {trial.config.device} x{trial.gpus_per_trial}",
                   **(extra_annotations or {})}
    return _job(trial, sweep, name=name, labels=labels, annotations=annotations, command=command, env=env,
                mounts=mounts, volumes=volumes, rendezvous=Rendezvous(), deadline=None, image=image,
                namespace=namespace, owner=owner, catalog=catalog)


def queue_labels(sweep: Sweep) -> dict[str, str]:
    """The Kueue labels of a trial Job (none without spec.queue)."""
    spec = sweep.spec
    if not spec.queue:
        return {}
    return {KUEUE_QUEUE: spec.queue, **({KUEUE_PRIORITY: spec.priority_class} if spec.priority_class else {})}


def render_rendezvous_service(trial: Trial, *, namespace: str | None = None,
                              owner: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The headless Service that gives a multi-node trial's pods stable DNS names for torchrun's rendezvous."""
    metadata = _object_metadata(trial.name, trial_labels(trial), namespace=namespace, owner=owner)
    return {
        "apiVersion": "v1", "kind": "Service", "metadata": metadata,
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                 "selector": {"batch.kubernetes.io/job-name": trial.name},
                 "ports": [{"name": "rdzv", "port": RDZV_PORT, "targetPort": RDZV_PORT}]},
    }


ANNOTATION_SWEEP = f"{GROUP}/sweep-spec"
TUNER_COMPONENT = "tuner"
TUNER_STATE_DIR = "/tune-state"
TUNER_SERVICE_ACCOUNT = "kubesweep-tuner"  # the chart's (templates/tuner-rbac.yaml), whatever the Sweep says


def tuner_name(sweep: str) -> str:
    return f"{sweep[:MAX_TUNER_PREFIX].rstrip('-')}-tuner"


MAX_TUNER_PREFIX = 63 - len("-tuner")


def render_tuner_job(sweep: Sweep, *, image: str, trial_image: str | None = None, namespace: str | None = None,
                     tracking: TrackingEnv | None = None, owner: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The Job that runs a search (`strategy: tune` or `max_batch`, or sequential repeats) in the cluster:
    `python -m kubesweep.tune` with the sweep's spec (from a pod annotation, through the downward API), driving the
    trial Jobs with the kubernetes backend.

    `image` runs the tuner, with a ServiceAccount token that may create Jobs; `trial_image` (default: `image`)
    runs the trials, without one. The operator passes its own image (code kubesweep ships) as `image`, so the
    code of a Sweep's image never holds the tuner's token. What a Sweep author cannot steer:
    - the identity: always the ServiceAccount `kubesweep-tuner` (`spec.service_account` names the trials' only);
    - the state: Ray Tune's experiment (pickles the tuner loads back) lives on the pod's own scratch volume,
      which no trial mounts, never on a claim the sweep's trials write; the container restarts in place
      (`OnFailure`), so a crashed tuner resumes from that state, and a replaced pod starts the search afresh
      (trials that already ran are not lost: the backend still knows them).
    """
    spec = sweep.spec
    labels = {**sweep_labels(sweep.name), "app.kubernetes.io/component": TUNER_COMPONENT}
    command = ["python", "-m", "kubesweep.tune", "--spec", f"{CONFIG_DIR}/sweep.json", "--backend", "kubernetes",
               "--storage", TUNER_STATE_DIR]
    if namespace:
        command += ["--namespace", namespace]
    env = [{"name": "HOME", "value": "/tmp"}, {"name": "PYTHONUNBUFFERED", "value": "1"},
           {"name": "KUBESWEEP_RAY_TMP", "value": "/tmp/ray"},
           {"name": "KUBESWEEP_IMAGE", "value": trial_image or image},
           *(tracking.env() if tracking else [])]  # with the parent run, when there is one
    mounts = [{"name": "sweep-spec", "mountPath": CONFIG_DIR, "readOnly": True},
              {"name": "tmp", "mountPath": "/tmp"}, {"name": "state", "mountPath": TUNER_STATE_DIR}]
    volumes: list[dict[str, Any]] = [
        {"name": "sweep-spec", "downwardAPI": {"items": [
            {"path": "sweep.json", "fieldRef": {"fieldPath": f"metadata.annotations['{ANNOTATION_SWEEP}']"}}]}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "state", "emptyDir": {}},  # only this pod writes it: never a claim the trials mount
    ]
    container = {
        "name": "tuner", "image": image, "imagePullPolicy": "IfNotPresent", "command": command, "env": env,
        "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}},
        "volumeMounts": mounts,
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}},
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "OnFailure", "containers": [container], "volumes": volumes, "enableServiceLinks": False,
        "serviceAccountName": TUNER_SERVICE_ACCOUNT,
        "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "fsGroup": RUN_AS,
                            "seccompProfile": {"type": "RuntimeDefault"}},
    }
    annotations = {ANNOTATION_SWEEP: json.dumps(sweep.to_document(), sort_keys=True)}
    metadata: dict[str, Any] = {"name": tuner_name(sweep.name), "labels": labels}
    if namespace:
        metadata["namespace"] = namespace
    if owner:
        metadata["ownerReferences"] = [dict(owner)]
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": {
        "backoffLimit": 3,
        "ttlSecondsAfterFinished": max(spec.resources.ttl_seconds_after_finished, UNGUARDED_TTL_FLOOR),
        "template": {"metadata": {"labels": labels, "annotations": annotations}, "spec": pod_spec}}}


def render_trial(trial: Trial, sweep: Sweep, *, image: str, **kwargs: Any) -> list[dict[str, Any]]:
    objects = [render_job(trial, sweep, image=image, **kwargs)]
    if trial.num_nodes > 1:
        objects.insert(0, render_rendezvous_service(trial, namespace=kwargs.get("namespace"),
                                                    owner=kwargs.get("owner")))
    return objects


def render_plan(plan: Plan, *, allow_unpinned: bool = False, namespace: str | None = None,
                tracking: TrackingEnv | None = None, tuner_image: str | None = None) -> list[dict[str, Any]]:
    """Every object the sweep makes: its trial Jobs (with spec.warm_pods, a warm pod's Job for each slot kind
    instead, which the driver hands its trials to and makes as many of as `concurrency` allows) and, for a search,
    the tuner Job as the operator runs it, in `tuner_image` (the operator's image; a search sweep without one is a
    RenderError)."""
    image = resolve_image(plan.sweep, allow_unpinned=allow_unpinned)
    if plan.sweep.spec.adaptive and not tuner_image:
        raise RenderError(f"a {plan.sweep.spec.search_title}'s tuner runs the operator's image, not the "
                          "sweep's: pass --tuner-image IMAGE (the chart's operator image) or set "
                          "KUBESWEEP_TUNER_IMAGE")
    catalog = load_catalog()
    namespace = namespace or plan.sweep.metadata.namespace
    out: list[dict[str, Any]] = []
    slots: dict[str, Trial] = {}  # warm pods: one Job per slot kind shown; the driver hands the trials over
    for trial in plan.trials:
        if warm(trial, plan.sweep):
            slots.setdefault(worker_key(trial), trial)
            continue
        out += render_trial(trial, plan.sweep, image=image, namespace=namespace, tracking=tracking, catalog=catalog)
    for key, trial in slots.items():
        out.append(render_worker(trial, plan.sweep, name=f"{plan.sweep.name[:40].rstrip('-')}-warm-{key}"[:63],
                                 image=image, namespace=namespace, tracking=tracking, catalog=catalog))
    if plan.sweep.spec.adaptive:  # the search makes its trials as it runs
        out.append(render_tuner_job(plan.sweep, image=tuner_image or image, trial_image=image, namespace=namespace,
                                    tracking=tracking))
    return out


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def to_yaml(objects: list[dict[str, Any]]) -> str:
    """A YAML stream of manifests, without anchors, keys in the order written."""
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, width=1000)


def trial_config_from_job(job: Mapping[str, Any]) -> dict[str, Any] | None:
    """The trial config a rendered Job carries (None when it carries none)."""
    annotations = job.get("spec", {}).get("template", {}).get("metadata", {}).get("annotations", {})
    raw = annotations.get(ANNOTATION_CONFIG)
    return json.loads(raw) if raw else None
