"""The kubesweep operator: Sweep custom resources driven by the same planner, renderer and Kubernetes backend.

- `store.SweepResourceStore`: the Kubernetes backend's state in the Sweep resource (spec in, bounded status out)
  and its TrialSlices (each trial's phase and outcome);
- `cache.ClusterCache`: watch-backed caches of the trial Jobs and pods, one per watched namespace;
- `client.SweepClient`: what `sweep submit/status/... --backend kubernetes` uses when the CRD is installed;
- `controller.SweepController`: one idempotent step per sweep (requests, reconcile, status);
- `leader.LeaseElector`: a coordination.k8s.io Lease, so one replica acts at a time;
- `mlflow_rest.MlflowRest`: the sweep's MLflow parent run, its namespace's experiment and grant, Kueue's tags;
- `ownership`: the seal that says which namespace the operator made an experiment for (under its own key);
- `handlers`, `__main__`: the kopf wiring (`python -m kubesweep.operator`).

Only `handlers` and `__main__` import kopf.
"""
