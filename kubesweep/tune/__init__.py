"""Searches that make trials while they run: `strategy: tune` (Ray Tune), `strategy: max_batch` (bisection) and
sequential repeats (`repeat_until: {target, max}`).

- `kubesweep.tune.driver`: Ray Tune drives; each suggestion becomes a trial made by the planner
  (`plan.make_trial`) and run by a backend (local processes or Kubernetes Jobs). The trials' intermediate
  metrics come back through MLflow (`kubesweep.tune.metrics`), so ASHA or the median rule can stop a trial,
  which ends its process or deletes its Job.
- `kubesweep.tune.maxbatch`: per GPU type and precision, the largest batch size that fits.
- `kubesweep.tune.repeats`: each cell repeated until the interval of its metric is within the target.
- `kubesweep.tune.dispatch.run_search`: starts the search the spec names (`spec.SEARCH_RUNNERS`), for every
  backend: in `sweep submit`/`sweep resume` (the session layer) and in the tuner.
- `python -m kubesweep.tune`: the tuner as a process (the operator runs it as a Job for every search).

Ray and Optuna are imported inside the functions that use them (the `tune` extra); importing this package
imports neither.
"""

from __future__ import annotations
