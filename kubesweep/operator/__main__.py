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
import time
import uuid
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from kubesweep.backends.base import BackendError
from kubesweep.backends.k8s_client import load_config
from kubesweep.operator import testhooks
from kubesweep.operator.cache import ClusterCache
from kubesweep.operator.client import crd_installed
from kubesweep.operator.controller import SweepController
from kubesweep.operator.leader import LeaseElector
from kubesweep.operator.mlflow_rest import TrackingPolicy
from kubesweep.operator.ownership import MIN_KEY_BYTES
from kubesweep.operator.runtime import Runtime, Supervisor
from kubesweep.plan import DEFAULT_MAX_TRIALS

OWNERSHIP_KEY_ENV = "KUBESWEEP_MLFLOW_OWNERSHIP_KEY"

DEFAULT_LEASE = "kubesweep-operator"
USER_AGENT = "kubesweep-operator"


# Secrets the operator reads from its environment; each may instead come from a file named by NAME_FILE (the chart
# mounts them so: a file is not in the container's environment, which `kubectl exec ... env` and every process
# started in the container would see)
SECRET_ENV = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN", OWNERSHIP_KEY_ENV)


def secrets_from_files(environ: MutableMapping[str, str]) -> str | None:
    """Set each secret of `SECRET_ENV` whose `NAME_FILE` is given from that file (one trailing newline dropped), in
    this process only. Returns what is wrong (a file that cannot be read, or a secret given both ways), else None."""
    for name in SECRET_ENV:
        path = environ.get(f"{name}_FILE")
        if not path:
            continue
        if environ.get(name):
            return f"{name} and {name}_FILE are both set: give the secret one way"
        try:
            text = Path(path).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            return f"{name}_FILE: cannot read {path}: {exc.strerror if isinstance(exc, OSError) else exc}"
        environ[name] = text.removesuffix("\n")
    return None


def _env_list(name: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, "").split(",") if item.strip()]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


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
    p.add_argument("--tracking-allowed-host", action="append", dest="tracking_allowed_hosts", metavar="HOST",
                   default=None,
                   help="a tracking server a Sweep's spec.tracking.uri may name, besides --mlflow-uri (that URI "
                        "exactly: another path on its host is a Sweep's own server, allowed only here, without the "
                        "operator's credentials): HOST, HOST:PORT or *.DOMAIN (repeatable; env "
                        "KUBESWEEP_TRACKING_ALLOWED_HOSTS, comma-separated). A Sweep naming any other is Invalid, and "
                        "nothing is requested from it")
    p.add_argument("--tracking-secret", default=os.environ.get("KUBESWEEP_TRACKING_SECRET") or None, metavar="NAME",
                   help="Secret in each sweep's namespace with the `username`/`password` trials log to MLflow with "
                        "(env KUBESWEEP_TRACKING_SECRET). The operator's own MLflow credentials: "
                        "MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD, each also as a file named by NAME_FILE")
    p.add_argument("--mlflow-namespace-user-prefix", metavar="PREFIX",
                   default=os.environ.get("KUBESWEEP_MLFLOW_NAMESPACE_USER_PREFIX") or None,
                   help="the default MLflow server has a user per namespace, PREFIX + NAMESPACE, which its trials log "
                        "as: each sweep's experiment, NAMESPACE/EXPERIMENT, is made and sealed for its namespace and "
                        "that user gets EDIT on it, and nothing else (env KUBESWEEP_MLFLOW_NAMESPACE_USER_PREFIX; the "
                        "chart sets it). Needs the key that seals experiments, env KUBESWEEP_MLFLOW_OWNERSHIP_KEY or "
                        "the file KUBESWEEP_MLFLOW_OWNERSHIP_KEY_FILE names (at least 16 bytes; the chart mounts "
                        "it from a Secret only the operator reads)")
    p.add_argument("--tuner-image", default=os.environ.get("KUBESWEEP_TUNER_IMAGE") or None, metavar="IMAGE",
                   help="image the tuner Jobs of search sweeps run (env KUBESWEEP_TUNER_IMAGE; the chart sets the "
                        "operator's own image). The Sweep's image runs only the trials, which hold no token")
    p.add_argument("--allow-unpinned", action="store_true", help="accept job images not pinned by digest")
    # a string default goes through `type` too, so a bad KUBESWEEP_MAX_TRIALS is a usage error like a bad flag
    p.add_argument("--max-trials", type=_positive_int, metavar="N",
                   default=os.environ.get("KUBESWEEP_MAX_TRIALS") or str(DEFAULT_MAX_TRIALS),
                   help="a Sweep that makes more trials than this (a search: the most it can make) is refused "
                        f"before anything is expanded (env KUBESWEEP_MAX_TRIALS, default {DEFAULT_MAX_TRIALS:,})")
    p.add_argument("--default-queue", metavar="LOCALQUEUE", default=os.environ.get("KUBESWEEP_DEFAULT_QUEUE") or None,
                   help="Kueue LocalQueue for the trials of Sweeps that name no spec.queue: their Jobs are created "
                        "suspended and run when Kueue admits them (env KUBESWEEP_DEFAULT_QUEUE; chart value "
                        "kueue.defaultQueue)")
    p.add_argument("--priority-class", action="append", dest="priority_classes", metavar="NAME", default=None,
                   help="a Kueue WorkloadPriorityClass a Sweep's spec.priority_class may name (repeatable; env "
                        "KUBESWEEP_PRIORITY_CLASSES, comma-separated; chart value kueue.allowedPriorityClasses). The "
                        "operator creates trial Jobs as itself, so a Sweep naming any other is Invalid")
    p.add_argument("--test-hooks", action="store_true", default=os.environ.get("KUBESWEEP_TEST_HOOKS") == "1",
                   help="TESTS ONLY: copy a Sweep's kubesweep.io/test-pod-annotations onto its pods, and kill or "
                        "stop this process at the fault points named by KUBESWEEP_TEST_KILL_AT / "
                        "KUBESWEEP_TEST_STOP_AT (env KUBESWEEP_TEST_HOOKS=1)")
    p.add_argument("--kubeconfig", type=Path, default=None, help="kubeconfig file (default: $KUBECONFIG, "
                                                                 "~/.kube/config, in-cluster)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p


CRD_WAIT_S = 120.0  # how long a replica waits at its start for the API server to serve the Sweep resource


def wait_served(api_client: Any, timeout: float, interval: float = 1.0) -> bool:
    """Whether the API server serves the Sweep resource within `timeout` seconds (asked every `interval`)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if crd_installed(api_client):
                return True
        except BackendError as exc:  # not reachable yet: asked again
            logging.getLogger("kubesweep.operator").warning("waiting for the Sweep resource: %s", exc)
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    namespaces = args.namespace or ([] if args.all_namespaces else _env_list("KUBESWEEP_WATCH_NAMESPACES"))
    if not namespaces and not args.all_namespaces:
        sys.stderr.write("error: name the namespaces to watch (--namespace NS, repeatable) or --all-namespaces\n")
        return 2
    problem = secrets_from_files(os.environ)
    if problem is not None:
        sys.stderr.write(f"error: {problem}\n")
        return 2
    key = os.environ.get(OWNERSHIP_KEY_ENV, "").encode() or None
    if args.mlflow_namespace_user_prefix and (key is None or len(key) < MIN_KEY_BYTES):
        sys.stderr.write(f"error: --mlflow-namespace-user-prefix needs {OWNERSHIP_KEY_ENV}, the key that seals the "
                         f"namespaces' experiments (at least {MIN_KEY_BYTES} bytes)\n")
        return 2
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = str(args.kubeconfig)  # read by kopf's login and by the client alike

    import kopf
    import kubernetes

    from kubesweep.operator import handlers  # noqa: F401  (importing it registers the kopf handlers)

    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat.PLAIN)
    try:
        api_client, context_namespace = load_config(kubernetes, args.kubeconfig)
    except BackendError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    lease_namespace = args.lease_namespace or context_namespace or (namespaces[0] if namespaces else None)
    if not lease_namespace:
        sys.stderr.write("error: --lease-namespace is needed with --all-namespaces outside a pod\n")
        return 2
    identity = args.identity or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
    # every request of this replica names it (API server audit logs tell replicas apart); kopf's watches say kopf/
    api_client.user_agent = f"{USER_AGENT}/{identity}"
    faults = testhooks.FaultPoints()
    if args.test_hooks:
        try:
            faults = testhooks.FaultPoints.from_env(os.environ)
        except testhooks.TestHookError as exc:
            sys.stderr.write(f"error: {exc}\n")
            return 2
    elif os.environ.get(testhooks.KILL_ENV) or os.environ.get(testhooks.STOP_ENV):
        sys.stderr.write(f"warning: {testhooks.KILL_ENV}/{testhooks.STOP_ENV} ignored without --test-hooks\n")
    renew = args.renew_every or args.lease_duration / 3
    elector = LeaseElector(kubernetes.client.CoordinationV1Api(api_client), lease_namespace, args.lease_name,
                           identity, duration=args.lease_duration, renew_every=renew,
                           margin=min(2.0, args.lease_duration / 5))
    allowed = args.tracking_allowed_hosts or _env_list("KUBESWEEP_TRACKING_ALLOWED_HOSTS")
    tracking = TrackingPolicy(args.mlflow_uri or None, tuple(allowed), args.tracking_secret,
                              namespace_user_prefix=args.mlflow_namespace_user_prefix, ownership_key=key)
    cache = ClusterCache(api_client, None if args.all_namespaces else namespaces)
    controller = SweepController(api_client, may_write=elector.holding, lease_remaining=elector.remaining,
                                 faults=faults, tracking=tracking,
                                 tuner_image=args.tuner_image,
                                 test_hooks=args.test_hooks, allow_unpinned=args.allow_unpinned,
                                 max_trials=args.max_trials, cache=cache, default_queue=args.default_queue,
                                 priority_classes=tuple(args.priority_classes
                                                        or _env_list("KUBESWEEP_PRIORITY_CLASSES")))
    supervisor = Supervisor(controller.step, is_leader=elector.holding, resync=args.resync, workers=args.workers)
    if args.test_hooks:
        logging.getLogger("kubesweep.operator").warning(
            "TEST HOOKS ENABLED: Sweep annotations may set pod annotations; never in production")
        if faults:
            logging.getLogger("kubesweep.operator").warning("TEST FAULT POINTS: kill at %s, stop at %s",
                                                            faults.kill_at, faults.stop_at)
    # kopf finds the resources it serves once, at its start (it may not watch CRDs): a replica started before the
    # API server serves the Sweep resource (the chart's CRD just made) would never serve a Sweep
    if not wait_served(api_client, CRD_WAIT_S):
        sys.stderr.write(f"error: the API server does not serve sweeps.kubesweep.io after {CRD_WAIT_S:g} s: install "
                         "the chart's CRD (charts/kubesweep/crds/); exiting so that a restart looks again\n")
        return 1
    # standalone: kopf's own peering is off; the Lease above decides who acts.
    runtime = Runtime(elector, supervisor, cache=cache, on_lead=controller.leading)
    # kopf is given the identity: its own default asks the password database for this uid's name, which an image
    # run under an arbitrary uid (the chart's 65532, a platform's random one) need not list
    kopf_identity: Any = identity  # kopf's `Identity`, a NewType of str that kopf does not export
    kopf.run(clusterwide=args.all_namespaces, namespaces=namespaces, liveness_endpoint=args.liveness,
             standalone=True, memo=kopf.Memo(runtime=runtime), identity=kopf_identity)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
