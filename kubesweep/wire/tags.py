"""The MLflow tag names kubesweep writes and reads: one vocabulary for the job, the sweep's runs, the operator and
the reports (a tag written under one name and read under another is a run the reports cannot find)."""

from __future__ import annotations

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
