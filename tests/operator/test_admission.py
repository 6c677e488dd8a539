"""The operator's admission (`kubesweep.operator.admission.admit`): each check on its own, without a cluster (the
cluster tests: the Invalid phase in tests/operator/test_controller_cluster.py, priority classes in
tests/operator/test_kueue_cluster.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubesweep.operator.admission import CLAIM_ALLOWED, CLAIM_LABEL, Admitted, Policy, Refused, admit
from kubesweep.sweep_spec import Sweep, parse_sweep

DIGEST = "registry.example/job@sha256:" + "0" * 64
SOURCE = "sweeps.kubesweep.io/s in namespace ns"


def sweep(**spec: Any) -> Sweep:
    spec.setdefault("image", DIGEST)
    spec.setdefault("matrix", {"gpu": ["l4"], "batch_size": [8, 16]})
    return parse_sweep({"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "s"},
                        "spec": spec}, source=SOURCE, allow_unpinned=True)


def claims(**labels: Mapping[str, str]) -> Any:
    """The claims of the namespace, by name: their labels (a claim not named does not exist)."""
    asked: list[str] = []

    def claim_labels(name: str) -> Mapping[str, str] | None:
        asked.append(name)
        return labels.get(name)

    claim_labels.asked = asked  # type: ignore[attr-defined]
    return claim_labels


def refusal(verdict: Admitted | Refused) -> str:
    assert isinstance(verdict, Refused), verdict
    return verdict.reason


def test_a_sweep_that_passes_every_check_is_admitted_as_it_is() -> None:
    s = sweep()
    verdict = admit(s, Policy(max_trials=2), claims(), namespace="ns")
    assert verdict == Admitted(s)


def test_a_sweep_over_the_operators_trial_limit_is_refused_before_it_is_expanded() -> None:
    large = sweep(matrix={"gpu": ["l4"], "batch_size": [8, 16, 32]})
    reason = refusal(admit(large, Policy(max_trials=2), claims(), namespace="ns"))
    assert reason.startswith("sweep ns/s: ") and "3 trials, over the limit of 2" in reason
    assert "the operator's --max-trials, chart value operator.maxTrials" in reason
    assert isinstance(admit(large, Policy(max_trials=3), claims(), namespace="ns"), Admitted)
    assert isinstance(admit(large, Policy(max_trials=None), claims(), namespace="ns"), Admitted)  # no limit


def test_an_image_not_pinned_by_digest_is_refused_unless_the_operator_allows_it() -> None:
    tagged = sweep(image="registry.example/job:latest")
    reason = refusal(admit(tagged, Policy(), claims(), namespace="ns"))
    assert reason == (f"{SOURCE}: spec.image: image 'registry.example/job:latest' is not pinned by digest; pass "
                      "--allow-unpinned to use it")
    assert isinstance(admit(tagged, Policy(allow_unpinned=True), claims(), namespace="ns"), Admitted)


def test_a_claim_is_mounted_only_when_it_exists_and_is_open_to_sweeps() -> None:
    s = sweep(storage={"cache_claim": "cache", "checkpoint_claim": "ckpt"})
    opened = {CLAIM_LABEL: CLAIM_ALLOWED}
    reason = refusal(admit(s, Policy(), claims(cache=opened), namespace="ns"))
    assert reason == f"{SOURCE}: spec.storage.checkpoint_claim: no PersistentVolumeClaim 'ckpt' in namespace ns"
    reason = refusal(admit(s, Policy(), claims(cache={"team": "a"}, ckpt=opened), namespace="ns"))
    assert reason == (f"{SOURCE}: spec.storage.cache_claim: claim 'cache' is not open to sweeps; a namespace admin "
                      f"opens it with `kubectl label pvc cache {CLAIM_LABEL}={CLAIM_ALLOWED}`")
    assert isinstance(admit(s, Policy(), claims(cache=opened, ckpt=opened), namespace="ns"), Admitted)
    no_claims = claims()
    assert isinstance(admit(sweep(), Policy(), no_claims, namespace="ns"), Admitted)
    assert no_claims.asked == []  # a sweep that names no claim reads none


def test_a_sweep_runs_its_trials_only_as_default_or_a_service_account_opened_to_sweeps() -> None:
    """The operator creates trial Jobs as itself, and a cloud identity may follow the ServiceAccount (Workload
    Identity): a Sweep naming the namespace's deployer account would get its cloud credentials. The real-node
    test: tests/operator/test_controller_realnode.py::test_a_sweep_author_gains_nothing_beyond_the_sweep."""
    opened = {CLAIM_LABEL: CLAIM_ALLOWED}
    accounts = claims(deployer={"team": "a"}, trials=opened)

    def verdict(account: str | None) -> Admitted | Refused:
        s = sweep(**({"service_account": account} if account else {}))
        return admit(s, Policy(), claims(), namespace="ns", account_labels=accounts)

    assert isinstance(verdict(None), Admitted) and isinstance(verdict("default"), Admitted)
    assert accounts.asked == []  # the namespace's default account needs no look-up
    assert refusal(verdict("deployer")) == (
        f"{SOURCE}: spec.service_account: ServiceAccount 'deployer' is not open to sweeps (a Sweep may name "
        f"'default' and the accounts a namespace admin opened); a namespace admin opens it with "
        f"`kubectl label serviceaccount deployer {CLAIM_LABEL}={CLAIM_ALLOWED}`")
    assert refusal(verdict("ghost")) == f"{SOURCE}: spec.service_account: no ServiceAccount 'ghost' in namespace ns"
    assert isinstance(verdict("trials"), Admitted)
    # whoever reads no accounts (the default) admits only `default`
    assert "no ServiceAccount 'trials'" in refusal(admit(sweep(service_account="trials"), Policy(), claims(),
                                                       namespace="ns"))


def test_a_sweep_names_only_the_priority_classes_the_operator_may_give() -> None:
    """The operator creates trial Jobs as itself (the cluster test: tests/operator/test_kueue_cluster.py)."""
    def verdict(priority: str | None, *allowed: str) -> Admitted | Refused:
        spec = {"queue": "team-a", **({"priority_class": priority} if priority else {})}
        return admit(sweep(**spec), Policy(priority_classes=allowed), claims(), namespace="ns")

    assert isinstance(verdict(None), Admitted)  # no priority named: nothing to allow
    assert isinstance(verdict("high", "low", "high"), Admitted)
    refused = refusal(verdict("high", "low"))
    assert refused.startswith(f"{SOURCE}: spec.priority_class: ")
    assert "'high' is not a priority class this operator may give" in refused
    assert "allowed: low" in refused and "kueue.allowedPriorityClasses" in refused
    assert "allowed: none" in refusal(verdict("low"))  # none listed: none may be named


def test_a_sweep_without_a_queue_gets_the_operators_default_queue() -> None:
    admitted = admit(sweep(), Policy(default_queue="team-default"), claims(), namespace="ns")
    assert isinstance(admitted, Admitted) and admitted.sweep.spec.queue == "team-default"
    own = admit(sweep(queue="team-a"), Policy(default_queue="team-default"), claims(), namespace="ns")
    assert isinstance(own, Admitted) and own.sweep.spec.queue == "team-a"  # a queue it names stays
    none = admit(sweep(), Policy(), claims(), namespace="ns")
    assert isinstance(none, Admitted) and none.sweep.spec.queue is None


def test_the_first_failed_check_is_the_reason() -> None:
    """Size before image before claims before the priority class."""
    bad = sweep(matrix={"gpu": ["l4"], "batch_size": [8, 16, 32]}, image="registry.example/job:latest",
                storage={"cache_claim": "cache"}, queue="q", priority_class="high")
    assert "over the limit" in refusal(admit(bad, Policy(max_trials=2), claims(), namespace="ns"))
    assert "not pinned" in refusal(admit(bad, Policy(), claims(), namespace="ns"))
    assert "no PersistentVolumeClaim" in refusal(admit(bad, Policy(allow_unpinned=True), claims(), namespace="ns"))
    opened = claims(cache={CLAIM_LABEL: CLAIM_ALLOWED})
    assert "spec.priority_class" in refusal(admit(bad, Policy(allow_unpinned=True), opened, namespace="ns"))
