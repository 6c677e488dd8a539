"""The kubesweep operator: Sweep custom resources driven by the same planner, renderer and Job reconciler.

- `store.SweepResourceStore`: a sweep's state in the Sweep resource (spec in, bounded status out) and its
  TrialSlices (each trial's phase and outcome);
- `cache.ClusterCache`: watch-backed caches of the trial Jobs and pods, one per watched namespace;
- `client.SweepClient`: what `sweep submit/status/... --backend kubernetes` uses when the CRD is installed;
- `admission.admit`: whether the operator runs a Sweep, and the sweep as it runs it;
- `controller.SweepController`: one idempotent step per sweep (admission, requests, reconcile, status), each
  `controller.NamespaceReconciler` composing `backends.k8s_reconcile.JobReconciler` with the parts here;
- `leader.LeaseElector`: a coordination.k8s.io Lease, so one replica acts at a time; `leader.LeaseGuard` guards
  every write with it;
- `evictions.EvictionTags`: Kueue's evictions tagged on the trials' MLflow runs;
- `mlflow_rest.MlflowRest`: the sweep's MLflow parent run, its namespace's experiment and grant, Kueue's tags;
- `ownership`: the seal that says which namespace the operator made an experiment for (under its own key);
- `handlers`, `__main__`: the kopf wiring (`python -m kubesweep.operator`).

Only `handlers` and `__main__` import kopf.
"""
