"""The job's command line: the one place that says how a trial is launched, locally or in a pod."""

from __future__ import annotations

from kubesweep.wire import tags

JOB_MODULE = "kubesweep.jobs"
RENDEZVOUS_MODULE = "kubesweep.jobs.rendezvous"
# Set in a trial's environment by the fork server: when its client started, where the trial's start-up time begins.
LAUNCHED_ENV = "KUBESWEEP_LAUNCHED_AT"
# Set on a queued trial's Job (spec.queue): epoch seconds of its creation; the job's queue wait is measured from it.
QUEUED_AT_ENV = "KUBESWEEP_QUEUED_AT"
# ... and its Kueue LocalQueue and priority class, which the job tags its MLflow run with (`QUEUE_TAGS`)
QUEUE_ENV = "KUBESWEEP_QUEUE"
PRIORITY_CLASS_ENV = "KUBESWEEP_PRIORITY_CLASS"
QUEUE_TAGS = {QUEUE_ENV: tags.KUEUE_QUEUE, PRIORITY_CLASS_ENV: tags.KUEUE_PRIORITY_CLASS}
# A trial's identity and its own directory on the checkpoint claim, so a retried pod resumes from it; a warm pod
# (kubesweep/jobs/worker.py) has the claim's root and sets both per trial.
SWEEP_ENV = "KUBESWEEP_SWEEP"
TRIAL_ID_ENV = "KUBESWEEP_TRIAL_ID"
CHECKPOINT_DIR_ENV = "KUBESWEEP_CHECKPOINT_DIR"
CHECKPOINT_ROOT_ENV = "KUBESWEEP_CHECKPOINT_ROOT"
WORKER_MODULE = "kubesweep.jobs.worker"


def job_argv(config_path: str, output_dir: str, *, python: str = "python", gpus: int = 1,
             num_nodes: int = 1, rdzv_endpoint: str | None = None) -> list[str]:
    """argv running one trial; more than one GPU (or node) runs it under torchrun (DDP)."""
    args = ["--config", config_path, "--output-dir", output_dir]
    if gpus <= 1 and num_nodes <= 1:
        return [python, "-m", JOB_MODULE, *args]
    launcher = [python, "-m", "torch.distributed.run", f"--nproc_per_node={max(gpus, 1)}"]
    if num_nodes > 1:
        if not rdzv_endpoint:
            raise ValueError("a multi-node trial needs a rendezvous endpoint")
        # torchrun through kubesweep.jobs.rendezvous: pod 0 of the Indexed Job hosts the store by its index
        launcher = [python, "-m", RENDEZVOUS_MODULE, f"--nproc_per_node={max(gpus, 1)}", f"--nnodes={num_nodes}",
                    "--rdzv_backend=c10d", f"--rdzv_endpoint={rdzv_endpoint}"]
    else:
        launcher += ["--standalone"]
    return [*launcher, "-m", JOB_MODULE, *args]
