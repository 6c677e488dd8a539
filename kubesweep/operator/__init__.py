"""The kubesweep operator: Sweep custom resources driven by the same planner, renderer and Kubernetes backend.

- `store.SweepStore`: the Kubernetes backend with its state in the Sweep resource (spec in, status out);
- `client.SweepClient`: what `sweep submit/status/... --backend kubernetes` uses when the CRD is installed;
- `controller.SweepController`: one idempotent step per sweep (requests, reconcile, status);
- `leader.LeaseElector`: a coordination.k8s.io Lease, so one replica acts at a time;
- `handlers`, `__main__`: the kopf wiring (`python -m kubesweep.operator`).

Only `handlers` and `__main__` import kopf.
"""
