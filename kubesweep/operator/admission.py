"""Admission: whether the operator runs a Sweep as its spec stands, and the sweep as it runs it.

The CRD's schema and the `Sweep` model check a spec's form; `admit` checks what only the operator can: its size
against `--max-trials`, an image its trials can run as, the claims it mounts (open to sweeps by a namespace
admin), the ServiceAccount its trials run as (`default`, or one a namespace admin opened to sweeps), the Kueue
priority class it names (one the chart allows), and it gives a sweep that names no queue the
operator's default queue. The controller admits a Sweep once per change of its spec and publishes a refusal as
the Sweep's `Invalid` phase; nothing of a refused Sweep runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kubesweep.manifests import image_problem
from kubesweep.plan import SweepTooLarge, check_size
from kubesweep.sweep_spec import Sweep

# The label that opens a PersistentVolumeClaim (spec.storage) or a ServiceAccount (spec.service_account) to sweeps'
# trials: set by whoever may label them, a namespace admin
CLAIM_LABEL = "kubesweep.io/sweeps"
CLAIM_ALLOWED = "allowed"
CLAIM_FIELDS = ("cache_claim", "checkpoint_claim")

# The ServiceAccount trial pods run as when a Sweep names none; the only one a Sweep may name unopened
DEFAULT_SERVICE_ACCOUNT = "default"

# A claim's (or a ServiceAccount's) labels in the Sweep's namespace, or None when there is none of that name
ClaimLabels = Callable[[str], Mapping[str, str] | None]
AccountLabels = Callable[[str], Mapping[str, str] | None]


def no_accounts(name: str) -> Mapping[str, str] | None:
    """A namespace without ServiceAccounts to look at: every one but `default` is refused."""
    return None


@dataclass(frozen=True)
class Policy:
    """What this operator admits (its flags and chart values)."""

    max_trials: int | None = None  # --max-trials, operator.maxTrials (None: no limit)
    allow_unpinned: bool = False  # images by tag too (--allow-unpinned; never in production)
    default_queue: str | None = None  # the Kueue LocalQueue of sweeps that name none (--default-queue)
    priority_classes: tuple[str, ...] = ()  # the Kueue WorkloadPriorityClasses a Sweep may name


@dataclass(frozen=True)
class Admitted:
    sweep: Sweep  # as the operator runs it (with the default queue where it names none)


@dataclass(frozen=True)
class Refused:
    reason: str  # in the Sweep's words (its source and field), for its status message


def admit(sweep: Sweep, policy: Policy, claim_labels: ClaimLabels, *, namespace: str,
          account_labels: AccountLabels = no_accounts) -> Admitted | Refused:
    """The sweep as the operator runs it, or why it does not run it (the first check that fails).
    `account_labels` reads the namespace's ServiceAccounts (without it, a Sweep may name only `default`)."""
    sweep = with_default_queue(sweep, policy.default_queue)
    problem = size_problem(sweep, policy.max_trials, namespace)
    if problem is not None:
        return Refused(problem)
    problem = image_problem(sweep, allow_unpinned=policy.allow_unpinned)
    if problem is not None:  # no image its trials can run as (e.g. a lock key not built yet)
        return Refused(f"{sweep.source}: spec.image: {problem}")
    problem = (claim_problem(sweep, claim_labels, namespace) or account_problem(sweep, account_labels, namespace)
               or priority_problem(sweep, policy.priority_classes))
    if problem is not None:
        return Refused(f"{sweep.source}: {problem}")
    return Admitted(sweep)


def with_default_queue(sweep: Sweep, queue: str | None) -> Sweep:
    """The sweep with `queue` as its Kueue queue when it names none (as it is otherwise)."""
    if not queue or sweep.spec.queue:
        return sweep
    return sweep.model_copy(update={"spec": sweep.spec.model_copy(update={"queue": queue})})


def size_problem(sweep: Sweep, max_trials: int | None, namespace: str) -> str | None:
    """Why the sweep has too many trials for this operator (counted from its axes, before anything is
    expanded); None: it has not."""
    if max_trials is None:
        return None
    try:
        check_size(sweep, max_trials, source=f"sweep {namespace}/{sweep.name}",
                   hint="the operator's --max-trials, chart value operator.maxTrials")
    except SweepTooLarge as exc:
        return str(exc)
    return None


def claim_problem(sweep: Sweep, claim_labels: ClaimLabels, namespace: str) -> str | None:
    """Why the sweep may not mount a claim it names (None: it may). A claim is open to sweeps only when a
    namespace admin labelled it `kubesweep.io/sweeps=allowed`: without that, a Sweep could mount any claim of
    the namespace (MLflow's store, another team's checkpoints) read-write into pods running its own image."""
    storage = sweep.spec.storage
    for field_name in CLAIM_FIELDS:
        claim = getattr(storage, field_name)
        if not claim:
            continue
        labels = claim_labels(claim)
        if labels is None:
            return f"spec.storage.{field_name}: no PersistentVolumeClaim {claim!r} in namespace {namespace}"
        if labels.get(CLAIM_LABEL) != CLAIM_ALLOWED:
            return (f"spec.storage.{field_name}: claim {claim!r} is not open to sweeps; a namespace admin opens "
                    f"it with `kubectl label pvc {claim} {CLAIM_LABEL}={CLAIM_ALLOWED}`")
    return None


def account_problem(sweep: Sweep, account_labels: AccountLabels, namespace: str) -> str | None:
    """Why the sweep's trials may not run as the ServiceAccount it names (None: they may). Trial pods mount no
    token, but where a cloud identity follows the ServiceAccount (GKE Workload Identity, EKS Pod Identity, Azure
    workload identity) the pod gets that account's cloud credentials without one; the operator creates the Jobs
    as itself, so Kubernetes would let a Sweep name any ServiceAccount of the namespace. Only `default` (what a
    pod of the namespace runs as anyway) and those a namespace admin opened to sweeps may be named."""
    wanted = sweep.spec.service_account
    if not wanted or wanted == DEFAULT_SERVICE_ACCOUNT:
        return None
    labels = account_labels(wanted)
    if labels is None:
        return f"spec.service_account: no ServiceAccount {wanted!r} in namespace {namespace}"
    if labels.get(CLAIM_LABEL) != CLAIM_ALLOWED:
        return (f"spec.service_account: ServiceAccount {wanted!r} is not open to sweeps (a Sweep may name "
                f"{DEFAULT_SERVICE_ACCOUNT!r} and the accounts a namespace admin opened); a namespace admin opens it "
                f"with `kubectl label serviceaccount {wanted} {CLAIM_LABEL}={CLAIM_ALLOWED}`")
    return None


def priority_problem(sweep: Sweep, allowed: tuple[str, ...]) -> str | None:
    """Why the sweep may not name its Kueue priority class (None: it may). The operator creates the trial Jobs
    with its own identity, so a policy that keeps high priorities to some users (an admission policy on Jobs)
    sees the operator, not the Sweep's author: only the classes the chart lists may be named."""
    wanted = sweep.spec.priority_class
    if not wanted or wanted in allowed:
        return None
    names = ", ".join(allowed) or "none"
    return (f"spec.priority_class: {wanted!r} is not a priority class this operator may give trials (allowed: "
            f"{names}; the operator's --priority-class, chart value kueue.allowedPriorityClasses)")
