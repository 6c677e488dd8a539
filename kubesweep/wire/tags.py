"""The MLflow tag names kubesweep writes and reads: one vocabulary for the job, the sweep's runs, the operator and
the reports (a tag written under one name and read under another is a run the reports cannot find)."""

from __future__ import annotations

import re

# On a sweep's parent run and on every trial's run
SWEEP = "kubesweep.sweep"
# On a sweep's parent run
ROLE = "kubesweep.role"
PARENT_ROLE = "parent"
BACKEND = "kubesweep.backend"
TRIALS = "kubesweep.trials"
BEST = "kubesweep.best"  # BEST.<task>.<gpu>.<metric>: the best setting and its figure, once the sweep has ended
SWEEP_UID = "kubesweep.sweep-uid"  # the Sweep resource's uid: a sweep deleted and made again is a new parent run
# On a trial's run: who it is
TRIAL_ID = "kubesweep.trial_id"
TRIAL = "kubesweep.trial"  # the trial's readable name
REPEAT = "kubesweep.repeat"
# On a trial's run: its cell (the settings the runs view groups by)
GPU = "kubesweep.gpu"
PRECISION = "kubesweep.precision"
COMPILE = "kubesweep.compile"
BATCH_SIZE = "kubesweep.batch_size"
ENGINE = "kubesweep.engine"
TASK = "kubesweep.task"
# On a trial's run: how it ended and what the reports say of it
OUTCOME = "kubesweep.outcome"
FLAGS = "kubesweep.flags"  # a trial's flags, to search by
# On a trial's run under Kueue: its LocalQueue and priority class (the job's), how often Kueue evicted it and the
# last time's words (the operator's)
KUEUE_QUEUE = "kueue.queue"
KUEUE_PRIORITY_CLASS = "kueue.priority_class"
KUEUE_EVICTIONS = "kueue.evictions"
KUEUE_LAST_EVICTION = "kueue.last_eviction"
# On an experiment the operator made for a namespace
OWNER_SEAL = "kubesweep.owner-seal"
NAMESPACE = "kubesweep.namespace"  # for people and the UI only: the seal says whose an experiment is
# MLflow's own tags that kubesweep sets
PARENT_RUN = "mlflow.parentRunId"
RUN_NAME = "mlflow.runName"
NOTE = "mlflow.note.content"  # a run's Description in the runs view

RUN_ID_RE = re.compile(r"[A-Za-z0-9]{1,64}")  # MLflow's run ids (hex): quoted into a search filter as they are
TRIAL_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,200}")  # what a trial id is made of (plan.make_trial); quoted too


def trial_run_filter(parent_run_id: str, trial_id: str) -> str:
    """The MLflow search filter for a trial's child run under the sweep's parent run: its trial id tag AND its
    parent run tag. The trial id alone also finds the run of a sweep made before under the same name (same trial
    ids, another parent run) and any run someone who may edit the experiment tags with it. ValueError for an id
    that is not one (it is quoted into the filter as it is)."""
    if not RUN_ID_RE.fullmatch(parent_run_id):
        raise ValueError(f"not a run id: {parent_run_id[:80]!r}")
    if not TRIAL_ID_RE.fullmatch(trial_id):
        raise ValueError(f"not a trial id: {trial_id[:80]!r}")
    return f"tags.`{TRIAL_ID}` = '{trial_id}' AND tags.`{PARENT_RUN}` = '{parent_run_id}'"
