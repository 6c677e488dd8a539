"""Submission at scale: a 1,000-trial sweep through the Kubernetes backend onto the test control plane.

Prints: time until every Job exists (goal <= 20 s), API write requests per trial (goal <= 3; counted by the
API server's own `apiserver_request_total` on Jobs, Services and ConfigMaps, and by the backend), and the peak RSS
of the submitting process.

    python bench/submit_scale.py                      # starts the kwok test cluster (tests/cluster) if needed
    KUBECONFIG=~/.kube/config python bench/submit_scale.py --namespace bench   # any cluster you can write to
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import resource
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubesweep.backends.kubernetes import KubernetesBackend  # noqa: E402
from kubesweep.plan import plan  # noqa: E402
from kubesweep.sweep_spec import parse_sweep  # noqa: E402

DIGEST = "registry.example/kubesweep-job@sha256:" + "0" * 64
WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE", "APPLY")


def cluster_client(kubeconfig: str | None) -> tuple[Any, Any]:
    """(api client, cluster object or None). Starts the kwok test cluster when no kubeconfig is given."""
    from kubernetes import config

    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig), None
    spec = importlib.util.spec_from_file_location("kwok_cluster", ROOT / "tests" / "cluster" / "kwok_cluster.py")
    assert spec and spec.loader
    kwok = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = kwok
    spec.loader.exec_module(kwok)
    cluster = kwok.start_cluster(os.environ.get("KUBESWEEP_TEST_CLUSTER", "kubesweep-bench"))
    return config.new_client_from_config(config_file=str(cluster.kubeconfig)), cluster


def write_requests(api: Any) -> int:
    """Write requests the API server has counted on the objects a submission writes (Jobs, Services,
    ConfigMaps; not their status subresource, which the Job controller writes)."""
    method, url, headers, body, _ = api.param_serialize("GET", "/metrics", auth_settings=["BearerToken"])
    resp = api.call_api(method, url, header_params=headers, body=body)
    resp.read()
    total = 0
    for line in resp.data.decode().splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
        if (labels.get("verb") in WRITE_VERBS and labels.get("resource") in ("jobs", "services", "configmaps")
                and not labels.get("subresource")):
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=1000, help="sweep size (multiple of 40)")
    parser.add_argument("--namespace", default=None, help="existing namespace (default: a fresh one)")
    parser.add_argument("--output", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args()
    api, cluster = cluster_client(os.environ.get("KUBECONFIG"))
    from kubernetes import client

    core = client.CoreV1Api(api)
    namespace = args.namespace or f"bench-{uuid.uuid4().hex[:6]}"
    if not args.namespace:
        core.create_namespace({"metadata": {"name": namespace}})
    learning_rates = [round(1e-5 * (i + 1), 7) for i in range(args.trials // 40)]
    doc = {"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "submit-scale"},
           "spec": {"image": DIGEST,
                    "matrix": {"gpu": ["h100-80gb", "a100-40gb", "l40s", "l4"], "batch_size": list(range(8, 88, 8)),
                               "learning_rate": learning_rates},
                    "concurrency": {"max_parallel": args.trials}}}
    p = plan(parse_sweep(doc))
    backend = KubernetesBackend(namespace=namespace, api_client=api)
    batch = client.BatchV1Api(api)
    try:
        writes_before = write_requests(api)
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.perf_counter()
        backend.submit(p)
        submitted = time.perf_counter() - start
        while True:
            jobs = batch.list_namespaced_job(namespace, label_selector="kubesweep.io/sweep=submit-scale",
                                             _preload_content=False)
            count = len(json.loads(jobs.data)["items"])
            if count >= len(p.trials):
                break
            time.sleep(0.2)
        all_exist = time.perf_counter() - start
        writes = write_requests(api) - writes_before
        figures = {
            "trials": len(p.trials),
            "submit_call_s": round(submitted, 2),
            "all_jobs_exist_s": round(all_exist, 2),
            "api_writes_total": writes,
            "api_writes_per_trial": round(writes / len(p.trials), 2),
            "backend_writes_per_trial": round(backend.writes / len(p.trials), 2),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "rss_before_submit_mib": round(rss_before / 1024, 1),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "cluster": "kwok test control plane" if cluster else os.environ.get("KUBECONFIG"),
        }
    finally:
        backend.close()
        if not args.namespace:
            core.delete_namespace(namespace)
    print(f"{figures['trials']} trials: every Job exists after {figures['all_jobs_exist_s']} s (goal <= 20 s); "
          f"{figures['api_writes_per_trial']} API writes per trial (goal <= 3); "
          f"peak RSS {figures['peak_rss_mib']} MiB")
    if args.output:
        args.output.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
