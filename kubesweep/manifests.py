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
from dataclasses import dataclass
from typing import Any

import yaml

from kubesweep.gpus import GPU_RESOURCE, PRODUCT_LABEL, Catalog, load_catalog
from kubesweep.jobs.command import job_argv
from kubesweep.outcomes import ExitCode
from kubesweep.plan import Plan, Trial
from kubesweep.spec import DIGEST_RE, Sweep

GROUP = "kubesweep.io"
LABEL_SWEEP = f"{GROUP}/sweep"
LABEL_TRIAL = f"{GROUP}/trial"
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


# Names the Secret with the tracking server's credentials for trials (TrackingEnv.credentials_secret); set in the
# operator by the chart, and by the operator in the tuner, which passes it on to the trial Jobs it makes.
TRACKING_SECRET_ENV = "KUBESWEEP_TRACKING_SECRET"


# Finished Jobs that carry no finalizer (direct backend, tuner, the tuner's own Job) are kept at least this long,
# whatever the spec's ttl_seconds_after_finished, so whoever follows them records their outcomes before the TTL
# controller deletes them.
UNGUARDED_TTL_FLOOR = 600


class RenderError(ValueError):
    pass


@dataclass(frozen=True)
class TrackingEnv:
    """What a trial needs to log into MLflow (never MLFLOW_RUN_ID: that would write into the parent run)."""

    uri: str
    experiment: str
    parent_run_id: str | None = None
    # A Secret of the trial's namespace with keys `username` and `password`: the tracking server's credentials
    # for trials (the chart's MLflow has authentication on), passed as MLflow's MLFLOW_TRACKING_USERNAME/PASSWORD.
    credentials_secret: str | None = None

    def env(self) -> list[dict[str, Any]]:
        env: list[dict[str, Any]] = [{"name": "MLFLOW_TRACKING_URI", "value": self.uri},
                                     {"name": "KUBESWEEP_EXPERIMENT", "value": self.experiment}]
        if self.parent_run_id:
            env.append({"name": "KUBESWEEP_PARENT_RUN_ID", "value": self.parent_run_id})
        if self.credentials_secret:
            env += [{"name": TRACKING_SECRET_ENV, "value": self.credentials_secret},
                    *({"name": name, "valueFrom": {"secretKeyRef": {"name": self.credentials_secret, "key": key}}}
                      for name, key in (("MLFLOW_TRACKING_USERNAME", "username"),
                                        ("MLFLOW_TRACKING_PASSWORD", "password")))]
        return env


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


def resolve_image(sweep: Sweep, *, allow_unpinned: bool = False) -> str:
    image = sweep.image_reference()
    if not image:
        raise RenderError(f"{sweep.source}: spec.image is required to run trials on Kubernetes "
                          "(a digest-pinned job image, see images/README.md)")
    if not allow_unpinned and not DIGEST_RE.match(image):
        raise RenderError(f"{sweep.source}: image {image!r} is not pinned by digest; pass --allow-unpinned to use it")
    return image


def render_job(trial: Trial, sweep: Sweep, *, image: str, namespace: str | None = None,
               tracking: TrackingEnv | None = None, owner: Mapping[str, Any] | None = None,
               catalog: Catalog | None = None, extra_annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    catalog = catalog or load_catalog()
    spec = sweep.spec
    res = spec.resources
    gpus = trial.gpus_per_trial
    nodes = trial.num_nodes
    labels = trial_labels(trial)
    config_json = json.dumps(trial.config.model_dump(mode="json", by_alias=True), sort_keys=True)
    annotations = {ANNOTATION_CONFIG: config_json, ANNOTATION_LABEL: trial.label(), **(extra_annotations or {})}

    rdzv = f"{trial.name}-0.{trial.name}:{RDZV_PORT}" if nodes > 1 else None
    command = job_argv(f"{CONFIG_DIR}/trial.json", OUTPUT_DIR, python="python", gpus=max(gpus, 1),
                       num_nodes=nodes, rdzv_endpoint=rdzv)
    limits: dict[str, str] = {"cpu": res.cpu, "memory": res.memory}
    if gpus:
        limits[GPU_RESOURCE] = str(gpus)
    env = [
        {"name": "KUBESWEEP_SWEEP", "value": trial.config.sweep},
        {"name": "KUBESWEEP_TRIAL_ID", "value": trial.id},
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
    if spec.storage.checkpoint_claim:
        env.append({"name": "KUBESWEEP_CHECKPOINT_DIR", "value": f"{CHECKPOINT_DIR}/{trial.config.sweep}/{trial.id}"})
    mounts = [
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
        {"name": "cache", **({"persistentVolumeClaim": {"claimName": spec.storage.cache_claim}}
                             if spec.storage.cache_claim else {"emptyDir": {}})},
        {"name": "tmp", "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": res.shm_size}},
    ]
    if spec.storage.checkpoint_claim:
        mounts.append({"name": "checkpoints", "mountPath": CHECKPOINT_DIR})
        volumes.append({"name": "checkpoints", "persistentVolumeClaim": {"claimName": spec.storage.checkpoint_claim}})
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "env": env,
        "resources": {"requests": dict(limits), "limits": limits},
        "volumeMounts": mounts,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    if nodes > 1:
        container["ports"] = [{"name": "rdzv", "containerPort": RDZV_PORT}]
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": volumes,
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            "fsGroup": RUN_AS,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    if spec.service_account:
        pod_spec["serviceAccountName"] = spec.service_account
    if trial.gpu:
        pod_spec["nodeSelector"] = {PRODUCT_LABEL: catalog[trial.gpu].product}
    if gpus:
        pod_spec["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    if nodes > 1:
        pod_spec["subdomain"] = trial.name
    job_spec: dict[str, Any] = {
        "backoffLimit": res.retries,
        "activeDeadlineSeconds": res.deadline_seconds,
        "ttlSecondsAfterFinished": res.ttl_seconds_after_finished,
        # Rules apply in order. A disrupted pod (evicted, preempted, drained) is replaced whatever its exit code,
        # without counting against backoffLimit. Then an OOM fails the Job at once: the job's own exit 3 (CUDA
        # out of memory) or 137, the SIGKILL a container gets when it exceeds its memory limit (a SIGKILL after
        # an eviction's grace period carries DisruptionTarget and matched the first rule). Retrying either
        # would only run out of memory again; so would a GPU mismatch (4).
        "podFailurePolicy": {"rules": [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            {"action": "FailJob",
             "onExitCodes": {"containerName": CONTAINER, "operator": "In",
                             "values": [int(ExitCode.OOM), int(ExitCode.GPU_MISMATCH), SIGKILL_EXIT]}},
        ]},
        "template": {"metadata": {"labels": dict(labels), "annotations": annotations}, "spec": pod_spec},
    }
    if nodes > 1:
        job_spec.update({"completionMode": "Indexed", "completions": nodes, "parallelism": nodes})
    metadata: dict[str, Any] = {"name": trial.name, "labels": labels,
                                "annotations": {ANNOTATION_LABEL: trial.label()}}
    if namespace:
        metadata["namespace"] = namespace
    if owner:
        metadata["ownerReferences"] = [dict(owner)]
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": job_spec}


def render_rendezvous_service(trial: Trial, *, namespace: str | None = None,
                              owner: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The headless Service that gives a multi-node trial's pods stable DNS names for torchrun's rendezvous."""
    metadata: dict[str, Any] = {"name": trial.name, "labels": trial_labels(trial)}
    if namespace:
        metadata["namespace"] = namespace
    if owner:
        metadata["ownerReferences"] = [dict(owner)]
    return {
        "apiVersion": "v1", "kind": "Service", "metadata": metadata,
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                 "selector": {"batch.kubernetes.io/job-name": trial.name},
                 "ports": [{"name": "rdzv", "port": RDZV_PORT, "targetPort": RDZV_PORT}]},
    }


ANNOTATION_SWEEP = f"{GROUP}/sweep-spec"
TUNER_COMPONENT = "tuner"
TUNER_STATE_DIR = "/tune-state"


def tuner_name(sweep: str) -> str:
    return f"{sweep[:MAX_TUNER_PREFIX].rstrip('-')}-tuner"


MAX_TUNER_PREFIX = 63 - len("-tuner")


def render_tuner_job(sweep: Sweep, *, image: str, trial_image: str | None = None, namespace: str | None = None,
                     tracking: TrackingEnv | None = None, owner: Mapping[str, Any] | None = None,
                     service_account: str | None = None) -> dict[str, Any]:
    """The Job that runs a search (`strategy: tune` or `max_batch`) in the cluster: `python -m kubesweep.tune`
    with the sweep's spec (from a pod annotation, through the downward API), driving the trial Jobs with the
    kubernetes backend. Its state (Ray Tune's experiment) is kept on the checkpoint claim when the spec names
    one, so a restarted tuner pod resumes; otherwise on a scratch volume. A failed pod is retried (backoffLimit 3)
    and the new one resumes from that state.

    `image` runs the tuner, with a ServiceAccount token that may create Jobs; `trial_image` (default: `image`)
    runs the trials, without one. The operator passes its own image (code kubesweep ships) as `image`, so the
    code of a Sweep's image never holds the tuner's token."""
    spec = sweep.spec
    labels = {**sweep_labels(sweep.name), "app.kubernetes.io/component": TUNER_COMPONENT}
    state_dir = (f"{CHECKPOINT_DIR}/{sweep.name}/search" if spec.storage.checkpoint_claim else TUNER_STATE_DIR)
    command = ["python", "-m", "kubesweep.tune", "--spec", f"{CONFIG_DIR}/sweep.json", "--backend", "kubernetes",
               "--storage", state_dir]
    if namespace:
        command += ["--namespace", namespace]
    env = [{"name": "HOME", "value": "/tmp"}, {"name": "PYTHONUNBUFFERED", "value": "1"},
           {"name": "KUBESWEEP_RAY_TMP", "value": "/tmp/ray"},
           {"name": "KUBESWEEP_IMAGE", "value": trial_image or image},
           *(tracking.env() if tracking else [])]  # with the parent run, when there is one
    mounts = [{"name": "sweep-spec", "mountPath": CONFIG_DIR, "readOnly": True},
              {"name": "tmp", "mountPath": "/tmp"}]
    volumes: list[dict[str, Any]] = [
        {"name": "sweep-spec", "downwardAPI": {"items": [
            {"path": "sweep.json", "fieldRef": {"fieldPath": f"metadata.annotations['{ANNOTATION_SWEEP}']"}}]}},
        {"name": "tmp", "emptyDir": {}},
    ]
    if spec.storage.checkpoint_claim:
        mounts.append({"name": "state", "mountPath": CHECKPOINT_DIR})
        volumes.append({"name": "state", "persistentVolumeClaim": {"claimName": spec.storage.checkpoint_claim}})
    else:
        mounts.append({"name": "state", "mountPath": TUNER_STATE_DIR})
        volumes.append({"name": "state", "emptyDir": {}})
    container = {
        "name": "tuner", "image": image, "imagePullPolicy": "IfNotPresent", "command": command, "env": env,
        "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}},
        "volumeMounts": mounts,
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}},
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never", "containers": [container], "volumes": volumes, "enableServiceLinks": False,
        "serviceAccountName": service_account or spec.service_account or "kubesweep-tuner",
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
                tracking: TrackingEnv | None = None) -> list[dict[str, Any]]:
    image = resolve_image(plan.sweep, allow_unpinned=allow_unpinned)
    catalog = load_catalog()
    namespace = namespace or plan.sweep.metadata.namespace
    out: list[dict[str, Any]] = []
    for trial in plan.trials:
        out += render_trial(trial, plan.sweep, image=image, namespace=namespace, tracking=tracking, catalog=catalog)
    if plan.sweep.spec.search.strategy in ("tune", "max_batch"):  # the search makes its trials as it runs
        out.append(render_tuner_job(plan.sweep, image=image, namespace=namespace, tracking=tracking))
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
