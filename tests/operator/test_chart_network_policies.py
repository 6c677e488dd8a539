"""The chart's NetworkPolicies for trial pods and the operator, rendered by the real helm (built by
tests/cluster/build-tools.sh; marker `cluster` for that binary, no control plane is started). What they admit on a
node that enforces them (kube-router): tests/operator/test_controller_realnode.py::
test_a_trial_pod_reaches_mlflow_and_nothing_outside_its_allowance."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.operator.test_controller_cluster import CHART, DIGEST_SETS, RELEASE, helm

pytestmark = pytest.mark.cluster

TRIAL_PODS = {"matchExpressions": [{"key": "kubesweep.io/sweep", "operator": "Exists"},
                                   {"key": "app.kubernetes.io/component", "operator": "NotIn", "values": ["tuner"]}]}
DNS = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}]
DNS_PORTS = [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]
MLFLOW_PODS = {"matchLabels": {"app.kubernetes.io/name": "kubesweep", "app.kubernetes.io/instance": RELEASE,
                               "app.kubernetes.io/component": "mlflow"}}


def _policies(*values: str) -> dict[tuple[str, str], dict[str, Any]]:
    out = helm("template", RELEASE, str(CHART), "-n", "kubesweep", *DIGEST_SETS, *values).stdout
    return {(d["metadata"]["namespace"], d["metadata"]["name"]): d["spec"] for d in yaml.safe_load_all(out)
            if d and d["kind"] == "NetworkPolicy"}


def test_trial_pods_may_connect_to_mlflow_their_peers_and_dns_only() -> None:
    policies = _policies("--set", "watch.namespaces={team-a,team-b}")
    trials = {ns: spec for (ns, name), spec in policies.items() if name == "kubesweep-trials"}
    assert set(trials) == {"team-a", "team-b"}  # one per served namespace, none per Sweep
    for spec in trials.values():
        assert spec["podSelector"] == TRIAL_PODS  # every pod of a sweep but its tuner
        assert spec["policyTypes"] == ["Ingress", "Egress"]
        assert spec["ingress"] == [{"from": [{"podSelector": TRIAL_PODS}]}]
        assert spec["egress"] == [
            {"to": [{"podSelector": TRIAL_PODS}]},  # a multi-node trial's rendezvous, in its own namespace
            {"to": DNS, "ports": DNS_PORTS},
            {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kubesweep"}},
                     "podSelector": MLFLOW_PODS}], "ports": [{"port": 5000, "protocol": "TCP"}]}]
    # under watch.allNamespaces: the release namespace's, like the tuner's; off: none
    assert {k for k in _policies("--set", "watch.allNamespaces=true") if k[1] == "kubesweep-trials"} == {
        ("kubesweep", "kubesweep-trials")}
    assert not [k for k in _policies("--set", "watch.namespaces={team-a}", "--set",
                                     "trials.networkPolicy.enabled=false") if k[1] == "kubesweep-trials"]
    # more egress only where the chart's values open it (a tracking server outside the chart, the Hub)
    hub = _policies("--set", "watch.namespaces={team-a}", "--set", "mlflow.enabled=false", "--set-json",
                    'trials.networkPolicy.extraEgress=[{"ports":[{"port":443,"protocol":"TCP"}]}]')
    assert hub[("team-a", "kubesweep-trials")]["egress"][2:] == [{"ports": [{"port": 443, "protocol": "TCP"}]}]


def test_the_operator_takes_no_connection_and_connects_to_the_api_server_mlflow_and_dns_only() -> None:
    spec = _policies("--set", "watch.namespaces={team-a}")[("kubesweep", f"{RELEASE}-kubesweep-operator")]
    assert spec["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "kubesweep",
                                                   "app.kubernetes.io/instance": RELEASE,
                                                   "app.kubernetes.io/component": "operator"}}
    assert spec["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in spec  # nothing comes in
    assert spec["egress"] == [
        {"ports": [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}]},  # the API server
        {"to": DNS, "ports": DNS_PORTS},
        {"to": [{"podSelector": MLFLOW_PODS}], "ports": [{"port": 5000, "protocol": "TCP"}]}]
    narrowed = _policies("--set", "watch.namespaces={team-a}", "--set-json",
                         'operator.networkPolicy.apiServer=[{"to":[{"ipBlock":{"cidr":"10.0.0.1/32"}}],'
                         '"ports":[{"port":6443}]}]')[("kubesweep", f"{RELEASE}-kubesweep-operator")]
    assert narrowed["egress"][0] == {"to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}], "ports": [{"port": 6443}]}
