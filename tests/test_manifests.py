"""Rendering: every manifest passes strict offline validation against the Kubernetes OpenAPI schemas, and
carries what the trial needs (the server-side dry run is in tests/backends/test_kubernetes.py)."""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
import pytest
import yaml

from kubesweep.manifests import ANNOTATION_CONFIG, RenderError, render_plan, to_yaml, trial_config_from_job
from kubesweep.plan import plan
from kubesweep.sweep_spec import parse_sweep

K8S_VERSION = "1.37.0"
DIGEST = "registry.example/kubesweep-job@sha256:" + "ab" * 32


def sweep_doc(**spec: Any) -> dict[str, Any]:
    """A sweep whose trials render as Jobs of their own (spec.warm_pods false; the default is tested below)."""
    base = {"image": DIGEST, "matrix": {"gpu": ["h100-80gb", "l4"], "precision": ["bf16"]}, "warm_pods": False}
    return {"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "render"},
            "spec": {**base, **spec}}


def rendered(**spec: Any) -> list[dict[str, Any]]:
    return render_plan(plan(parse_sweep(sweep_doc(**spec))), namespace="bench")


def pod(job: dict[str, Any]) -> dict[str, Any]:
    return job["spec"]["template"]["spec"]  # type: ignore[no-any-return]


CASES = {
    "single-gpu": {},
    "multi-gpu": {"resources": {"gpus_per_trial": 4}},
    "multi-node": {"resources": {"gpus_per_trial": 8, "num_nodes": 2}},
    "cpu": {"matrix": {"batch_size": [8]}, "resources": {"gpus_per_trial": 0}},
    "volumes": {"storage": {"cache_claim": "hf-cache", "checkpoint_claim": "ckpt"}, "service_account": "trials"},
    "queued": {"queue": "team-a", "priority_class": "research-low"},
    "alone": {"placement": {"alone": True}},
    "warm": {"warm_pods": True, "storage": {"checkpoint_claim": "ckpt"}, "queue": "team-a"},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_manifest_validates_strictly(case: str) -> None:
    for obj in rendered(**CASES[case]):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_a_queued_sweeps_jobs_wait_suspended_in_its_kueue_queue_and_know_when_they_were_made() -> None:
    from kubesweep.manifests import render_job

    p = plan(parse_sweep(sweep_doc(queue="team-a", priority_class="research-low")))
    job = render_job(p.trials[0], p.sweep, image=DIGEST, queued_at=1795687200.5)
    assert job["spec"]["suspend"] is True
    labels = job["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "team-a"
    assert labels["kueue.x-k8s.io/priority-class"] == "research-low"
    env = {e["name"]: e.get("value") for e in pod(job)["containers"][0]["env"]}
    assert env["KUBESWEEP_QUEUED_AT"] == "1795687200.500"
    # the job tags its MLflow run with them (kueue.queue, kueue.priority_class)
    assert env["KUBESWEEP_QUEUE"] == "team-a" and env["KUBESWEEP_PRIORITY_CLASS"] == "research-low"
    # the pod's labels stay the trial's: Kueue reads the queue from the Job
    assert "kueue.x-k8s.io/queue-name" not in job["spec"]["template"]["metadata"]["labels"]


def test_without_a_queue_nothing_of_kueue_is_rendered() -> None:
    for job in rendered():
        assert "suspend" not in job["spec"]
        assert not any(k.startswith("kueue.x-k8s.io/") for k in job["metadata"]["labels"])
        names = {e["name"] for e in pod(job)["containers"][0]["env"]}
        assert not names & {"KUBESWEEP_QUEUED_AT", "KUBESWEEP_QUEUE", "KUBESWEEP_PRIORITY_CLASS"}


def test_gpu_trial_targets_the_exact_product_label() -> None:
    jobs = rendered()
    selectors = [pod(j)["nodeSelector"] for j in jobs]
    assert selectors == [{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, {"nvidia.com/gpu.product": "NVIDIA-L4"}]
    container = pod(jobs[0])["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["resources"]["requests"] == container["resources"]["limits"]
    assert pod(jobs[0])["tolerations"][0]["key"] == "nvidia.com/gpu"


def test_a_trial_measured_alone_keeps_every_other_trial_pod_of_its_namespace_off_its_node() -> None:
    term = {"labelSelector": {"matchLabels": {"app.kubernetes.io/component": "trial",
                                              "app.kubernetes.io/managed-by": "kubesweep"}},
            "topologyKey": "kubernetes.io/hostname"}
    for job in rendered(placement={"alone": True}):
        assert pod(job)["affinity"] == {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
        # its own pod carries the labels it selects: the rule holds both ways (the scheduler's anti-affinity is
        # symmetric), and no namespaceSelector: another namespace's pods are not its to keep away
        assert term["labelSelector"]["matchLabels"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
    assert all("affinity" not in pod(job) for job in rendered())


def test_restricted_pod_security() -> None:
    spec = pod(rendered()[0])
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = spec["containers"][0]["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}


def test_command_is_a_list_and_config_travels_as_annotation() -> None:
    job = rendered()[0]
    container = pod(job)["containers"][0]
    assert container["command"][:3] == ["python", "-m", "kubesweep.jobs"]
    config = trial_config_from_job(job)
    assert config is not None and config["gpu_product"] == "NVIDIA-H100-80GB-HBM3"
    items = pod(job)["volumes"][0]["downwardAPI"]["items"]
    assert items[0]["fieldRef"]["fieldPath"] == f"metadata.annotations['{ANNOTATION_CONFIG}']"


def test_hostile_values_never_reach_a_shell() -> None:
    job = rendered(job={"model": "x; rm -rf / #", "dataset": "$(reboot)"})[0]
    container = pod(job)["containers"][0]
    assert "sh" not in container["command"][0]
    assert json.loads(job["spec"]["template"]["metadata"]["annotations"][ANNOTATION_CONFIG])["job"]["model"] == (
        "x; rm -rf / #")


def test_multi_gpu_runs_torchrun() -> None:
    container = pod(rendered(resources={"gpus_per_trial": 4})[0])["containers"][0]
    assert container["command"][:4] == ["python", "-m", "torch.distributed.run", "--nproc_per_node=4"]


def test_multi_node_is_an_indexed_job_with_a_headless_service() -> None:
    objects = rendered(resources={"gpus_per_trial": 8, "num_nodes": 2})
    service, job = objects[0], objects[1]
    assert service["kind"] == "Service" and service["spec"]["clusterIP"] == "None"
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 2
    assert pod(job)["subdomain"] == service["metadata"]["name"]
    assert any(a.startswith("--rdzv_endpoint=") for a in pod(job)["containers"][0]["command"])
    assert pod(job)["containers"][0]["command"][:3] == ["python", "-m", "kubesweep.jobs.rendezvous"]


def test_failure_policy_never_retries_oom_and_ignores_disruptions() -> None:
    rules = rendered()[0]["spec"]["podFailurePolicy"]["rules"]
    # a disrupted pod is replaced even when the SIGKILL after its grace period made it exit 137
    assert rules[0] == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    assert rules[1] == {"action": "FailJob", "onExitCodes": {"containerName": "job", "operator": "In",
                                                            "values": [3, 4, 137]}}


def test_tracking_env_never_sets_the_run_id() -> None:
    from kubesweep.wire.env import TrackingEnv

    p = plan(parse_sweep(sweep_doc()))
    job = render_plan(p, tracking=TrackingEnv("http://mlflow:5000", "exp", "parent123"))[0]
    names = {e["name"] for e in pod(job)["containers"][0]["env"]}
    assert {"MLFLOW_TRACKING_URI", "KUBESWEEP_PARENT_RUN_ID", "KUBESWEEP_TRIAL_ID"} <= names
    assert "MLFLOW_RUN_ID" not in names


def test_unpinned_image_is_refused_unless_allowed() -> None:
    doc = sweep_doc(image="registry.example/job:1.0")
    p = plan(parse_sweep(doc, allow_unpinned=True))
    with pytest.raises(RenderError, match="not pinned by digest"):
        render_plan(p)
    assert render_plan(p, allow_unpinned=True)


def test_missing_image_is_a_clear_error() -> None:
    doc = sweep_doc()
    del doc["spec"]["image"]
    with pytest.raises(RenderError, match=r"^<input>: spec\.image: required to run trials on Kubernetes: name a key "
                                          r"of the image lock \(torch-2\.8-cu128, "):
        render_plan(plan(parse_sweep(doc)))


def test_yaml_stream_has_no_anchors() -> None:
    text = to_yaml(rendered())
    assert "&id" not in text and "*id" not in text
    assert len(list(yaml.safe_load_all(text))) == 2


def search_doc(search: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "t"},
            "spec": {"search": search, **spec}}


def test_tuner_job_manifest_is_a_valid_job() -> None:
    from kubesweep.manifests import ANNOTATION_SWEEP, render_plan, render_tuner_job, tuner_name
    from kubesweep.plan import plan

    sweep = parse_sweep(search_doc({"strategy": "tune", "space": {"batch_size": {"type": "choice", "values": [8]}}},
                                  image="registry.example/job@sha256:" + "0" * 64,
                                  storage={"checkpoint_claim": "ckpt"}))
    job = render_tuner_job(sweep, image="img@sha256:" + "1" * 64, namespace="ns",
                           trial_image="registry.example/job@sha256:" + "0" * 64)
    assert job["metadata"]["name"] == tuner_name("t") == "t-tuner"
    container = job["spec"]["template"]["spec"]["containers"][0]
    # the tuner (token that may create Jobs) runs the given image; the sweep's image only reaches its trials
    assert container["image"] == "img@sha256:" + "1" * 64
    assert {"name": "KUBESWEEP_IMAGE", "value": "registry.example/job@sha256:" + "0" * 64} in container["env"]
    assert container["command"][:4] == ["python", "-m", "kubesweep.tune", "--spec"]
    doc = json.loads(job["spec"]["template"]["metadata"]["annotations"][ANNOTATION_SWEEP])
    assert parse_sweep(doc).to_document() == sweep.to_document()
    assert len(tuner_name("x" * 63)) <= 63
    # with the sweep's MLflow parent run: each variable once (a duplicate is refused by server-side apply)
    from kubesweep.wire.env import TrackingEnv

    tracked = render_tuner_job(sweep, image="img@sha256:" + "1" * 64, namespace="ns",
                               tracking=TrackingEnv("http://mlflow:5000", "t", "run123"))
    names = [e["name"] for e in tracked["spec"]["template"]["spec"]["containers"][0]["env"]]
    assert len(names) == len(set(names)) and names.count("KUBESWEEP_PARENT_RUN_ID") == 1, names
    # a search plans no trials: its manifest is the tuner Job, as the operator runs it (in the operator's image)
    with pytest.raises(RenderError, match="--tuner-image"):
        render_plan(plan(sweep))
    (rendered,) = render_plan(plan(sweep), tuner_image="op@sha256:" + "2" * 64)
    assert rendered["metadata"]["name"] == "t-tuner"
    rendered_container = rendered["spec"]["template"]["spec"]["containers"][0]
    assert rendered_container["image"] == "op@sha256:" + "2" * 64
    assert {"name": "KUBESWEEP_IMAGE", "value": "registry.example/job@sha256:" + "0" * 64} in rendered_container["env"]
    kv = pytest.importorskip("kubernetes_validate")
    from tests.test_manifests import K8S_VERSION

    kv.validate(job, K8S_VERSION, strict=True)


def test_a_sweep_author_steers_neither_the_tuners_identity_nor_its_state() -> None:
    """The attack: a trial (the author's code) writes a `tuner.pkl` where the tuner keeps Ray Tune's state, and
    the tuner unpickles it with a token that may create Jobs; or the Sweep names a privileged ServiceAccount for
    the tuner. The tuner's state is on a volume of its own pod that no trial mounts, and it always runs as
    kubesweep-tuner."""
    from kubesweep.manifests import TUNER_SERVICE_ACCOUNT, render_tuner_job
    from kubesweep.plan import plan

    spec = {"image": "registry.example/job@sha256:" + "0" * 64, "service_account": "admin-sa",
            "storage": {"checkpoint_claim": "ckpt", "cache_claim": "cache"}}
    search = parse_sweep(search_doc({"strategy": "tune", "space": {"batch_size": {"type": "choice",
                                                                                  "values": [8]}}}, **spec))
    tuner = render_tuner_job(search, image="op@sha256:" + "1" * 64, namespace="ns")["spec"]["template"]["spec"]
    assert tuner["serviceAccountName"] == TUNER_SERVICE_ACCOUNT == "kubesweep-tuner"
    grid = {"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "t"},
            "spec": {**spec, "matrix": {"batch_size": [8, 16]}}}
    trial_claims = {v["persistentVolumeClaim"]["claimName"]
                    for job in render_plan(plan(parse_sweep(grid)), namespace="ns") if job["kind"] == "Job"
                    for v in job["spec"]["template"]["spec"]["volumes"] if "persistentVolumeClaim" in v}
    assert trial_claims == {"ckpt", "cache"}
    assert not [v for v in tuner["volumes"] if "persistentVolumeClaim" in v]  # no claim a trial could write
    command = tuner["containers"][0]["command"]
    storage = command[command.index("--storage") + 1]
    (mount,) = [m for m in tuner["containers"][0]["volumeMounts"] if storage.startswith(m["mountPath"])]
    (volume,) = [v for v in tuner["volumes"] if v["name"] == mount["name"]]
    assert volume == {"name": mount["name"], "emptyDir": {}}
    assert tuner["restartPolicy"] == "OnFailure"  # a crashed tuner restarts in its pod and resumes from there


def test_a_warm_sweep_renders_a_warm_pods_job_per_slot_kind_and_multi_node_trials_their_own() -> None:
    """spec.warm_pods: a warm pod's Job per GPU type and count, shaped as a trial's (resources, placement, claims,
    security, the queue) with the worker as its command, its hand-over from its pod's annotation, each trial's
    identity and checkpoint directory left to the worker, and no deadline of its own."""
    objects = rendered(warm_pods=True, matrix={"gpu": ["h100-80gb", "l4"], "batch_size": [8, 16]},
                       storage={"checkpoint_claim": "ckpt"}, queue="team-a")
    assert [o["metadata"]["name"] for o in objects] == ["render-warm-h100-80gb-1", "render-warm-l4-1"]
    job = objects[0]
    assert job["metadata"]["labels"]["kubesweep.io/worker"] == "h100-80gb-1" and job["spec"]["suspend"] is True
    container = pod(job)["containers"][0]
    assert container["command"] == ["python", "-m", "kubesweep.jobs.worker", "--handover",
                                    "/etc/kubesweep/handover.json", "--output-dir", "/workspace/output",
                                    "--sweep", "render"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert pod(job)["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert "KUBESWEEP_TRIAL_ID" not in env and "KUBESWEEP_CHECKPOINT_DIR" not in env
    assert env["KUBESWEEP_CHECKPOINT_ROOT"] == "/checkpoints" and env["KUBESWEEP_SWEEP"] == "render"
    (config,) = [v for v in pod(job)["volumes"] if v["name"] == "trial-config"]
    assert config["downwardAPI"]["items"] == [
        {"path": "handover.json", "fieldRef": {"fieldPath": "metadata.annotations['kubesweep.io/handover']"}}]
    assert "activeDeadlineSeconds" not in job["spec"] and pod(job)["automountServiceAccountToken"] is False
    assert "kubesweep.io/trial-config" not in job["spec"]["template"]["metadata"]["annotations"]
    multi = rendered(warm_pods=True, resources={"gpus_per_trial": 8, "num_nodes": 2})
    assert {o["kind"] for o in multi} == {"Job", "Service"} and all(
        "kubesweep.io/worker" not in o["metadata"]["labels"] for o in multi)


def test_warm_pods_are_the_default() -> None:
    """A spec that does not say: its one-node trials run in warm pods; `false` gives each trial its own Job."""
    doc = sweep_doc(matrix={"gpu": ["l4"], "batch_size": [8, 16]})
    del doc["spec"]["warm_pods"]
    assert parse_sweep(doc).spec.warm_pods is True
    assert [o["metadata"]["labels"].get("kubesweep.io/worker") for o in render_plan(plan(parse_sweep(doc)))] == \
        ["l4-1"]
    assert len(rendered(matrix={"gpu": ["l4"], "batch_size": [8, 16]})) == 2
