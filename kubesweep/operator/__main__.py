"""`python -m kubesweep.operator`: run the Sweep operator (kopf) with Lease-based leader election.

    python -m kubesweep.operator --namespace team-a --namespace team-b --liveness http://0.0.0.0:8080/healthz
    python -m kubesweep.operator --all-namespaces

Every replica watches; only the holder of the Lease (`--lease-name` in `--lease-namespace`) acts. Credentials:
$KUBECONFIG or ~/.kube/config when present, else the pod's ServiceAccount.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import uuid
from pathlib import Path

DEFAULT_LEASE = "kubesweep-operator"


def _env_list(name: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, "").split(",") if item.strip()]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m kubesweep.operator",
        description="Drive Sweep resources (sweeps.kubesweep.io): plan their trials, run them as Jobs owned by "
                    "the Sweep, and keep .status true. State lives in the cluster; any replica can take over.")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=None, metavar="NS",
                       help="watch this namespace (repeatable; env KUBESWEEP_WATCH_NAMESPACES, comma-separated)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    p.add_argument("--liveness", metavar="URL", default=os.environ.get("KUBESWEEP_LIVENESS"),
                   help="serve a health endpoint, e.g. http://0.0.0.0:8080/healthz")
    p.add_argument("--lease-name", default=os.environ.get("KUBESWEEP_LEASE_NAME", DEFAULT_LEASE),
                   help=f"leader-election Lease (default {DEFAULT_LEASE})")
    p.add_argument("--lease-namespace", default=os.environ.get("POD_NAMESPACE"),
                   help="namespace of the Lease (default: env POD_NAMESPACE, the in-cluster namespace, or the "
                        "first watched namespace)")
    p.add_argument("--identity", default=os.environ.get("POD_NAME"),
                   help="this replica's identity in the Lease; unique per replica (default: env POD_NAME, else "
                        "host name + random suffix)")
    p.add_argument("--lease-duration", type=float, default=15.0, help="seconds before a silent leader is replaced")
    p.add_argument("--renew-every", type=float, default=None, help="seconds between Lease renewals "
                                                                     "(default: a third of the duration)")
    p.add_argument("--resync", type=float, default=30.0, help="step every sweep at least this often (seconds)")
    p.add_argument("--workers", type=int, default=4, help="sweeps stepped in parallel")
    p.add_argument("--mlflow-uri", default=os.environ.get("MLFLOW_TRACKING_URI"),
                   help="MLflow tracking server for sweeps that name none (env MLFLOW_TRACKING_URI)")
    p.add_argument("--allow-unpinned", action="store_true", help="accept job images not pinned by digest")
    p.add_argument("--test-hooks", action="store_true", default=os.environ.get("KUBESWEEP_TEST_HOOKS") == "1",
                   help="TESTS ONLY: copy a Sweep's kubesweep.io/test-pod-annotations onto its pods "
                        "(env KUBESWEEP_TEST_HOOKS=1)")
    p.add_argument("--kubeconfig", type=Path, default=None, help="kubeconfig file (default: $KUBECONFIG, "
                                                                 "~/.kube/config, in-cluster)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    namespaces = args.namespace or ([] if args.all_namespaces else _env_list("KUBESWEEP_WATCH_NAMESPACES"))
    if not namespaces and not args.all_namespaces:
        sys.stderr.write("error: name the namespaces to watch (--namespace NS, repeatable) or --all-namespaces\n")
        return 2
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = str(args.kubeconfig)  # read by kopf's login and by the client alike

    import kopf
    import kubernetes

    from kubesweep.backends.base import BackendError
    from kubesweep.backends.kubernetes import _load_config
    from kubesweep.operator import handlers  # noqa: F401  (registers the handlers)
    from kubesweep.operator.controller import SweepController
    from kubesweep.operator.leader import LeaseElector
    from kubesweep.operator.runtime import Runtime, Supervisor

    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat.PLAIN)
    try:
        api_client, context_namespace = _load_config(kubernetes, args.kubeconfig)
    except BackendError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    lease_namespace = args.lease_namespace or context_namespace or (namespaces[0] if namespaces else None)
    if not lease_namespace:
        sys.stderr.write("error: --lease-namespace is needed with --all-namespaces outside a pod\n")
        return 2
    identity = args.identity or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
    renew = args.renew_every or args.lease_duration / 3
    elector = LeaseElector(kubernetes.client.CoordinationV1Api(api_client), lease_namespace, args.lease_name,
                           identity, duration=args.lease_duration, renew_every=renew,
                           margin=min(2.0, args.lease_duration / 5))
    controller = SweepController(api_client, may_write=elector.holding, mlflow_uri=args.mlflow_uri,
                                 test_hooks=args.test_hooks, allow_unpinned=args.allow_unpinned)
    supervisor = Supervisor(controller.step, is_leader=elector.holding, resync=args.resync, workers=args.workers)
    if args.test_hooks:
        logging.getLogger("kubesweep.operator").warning(
            "TEST HOOKS ENABLED: Sweep annotations may set pod annotations; never in production")
    # standalone: kopf's own peering is off; the Lease above decides who acts.
    kopf.run(clusterwide=args.all_namespaces, namespaces=namespaces, liveness_endpoint=args.liveness,
             standalone=True, memo=kopf.Memo(runtime=Runtime(elector, supervisor)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
