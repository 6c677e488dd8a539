"""The chart's MLflow users, rendered by the real helm (built by tests/cluster/build-tools.sh; marker `cluster` for
that binary, no control plane is started): no namespace's user can be the operator's or the admin's, and the key
that seals the namespaces' experiments reaches the operator alone."""

from __future__ import annotations

import pytest
import yaml

from tests.operator.test_controller_cluster import CHART, DIGEST_SETS, RELEASE, helm

pytestmark = pytest.mark.cluster


def _template(*values: str) -> tuple[int, str, str]:
    proc = helm("template", RELEASE, str(CHART), "-n", "kubesweep", *DIGEST_SETS, *values, check=False)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize(("values", "said"), [
    # namespace "operator" would log as kubesweep-operator, the operator's user
    (["--set", "watch.namespaces={operator}", "--set", "mlflow.auth.namespaceUserPrefix=kubesweep-"],
     'mlflow.auth.operatorUsername "kubesweep-operator" begins with mlflow.auth.namespaceUserPrefix "kubesweep-": '
     'the MLflow user of namespace "operator"'),
    # not served now, but any namespace may be later (or under watch.allNamespaces)
    (["--set", "watch.allNamespaces=true", "--set", "mlflow.auth.operatorUsername=kubesweep-ns-ops"],
     'mlflow.auth.operatorUsername "kubesweep-ns-ops" begins with mlflow.auth.namespaceUserPrefix "kubesweep-ns-"'),
    (["--set", "watch.namespaces={team-a}", "--set", "mlflow.auth.adminUsername=kubesweep-ns-root"],
     'mlflow.auth.adminUsername "kubesweep-ns-root" begins with'),
    (["--set", "watch.namespaces={team-a}", "--set", "mlflow.auth.operatorUsername=admin"],
     "mlflow.auth.operatorUsername and mlflow.auth.adminUsername are both \"admin\""),
], ids=["served-namespace", "any-namespace-later", "admin", "operator-is-admin"])
def test_a_namespace_user_that_could_be_the_operators_is_refused(values: list[str], said: str) -> None:
    code, _, err = _template(*values)
    assert code != 0 and said in err, err


def test_the_ownership_key_reaches_the_operator_alone() -> None:
    code, out, err = _template("--set", "watch.namespaces={team-a}")
    assert code == 0, err
    docs = [d for d in yaml.safe_load_all(out) if d]
    secret = f"{RELEASE}-kubesweep-mlflow-auth-ownership"
    assert any(d["kind"] == "Secret" and d["metadata"]["name"] == secret for d in docs)
    readers = {d["metadata"]["name"] for d in docs if d["kind"] == "Deployment" and secret in yaml.safe_dump(d)}
    assert readers == {f"{RELEASE}-kubesweep-operator"}, readers
    # with MLflow's auth off, nothing is refused for names that are not used
    code, _, err = _template("--set", "watch.namespaces={operator}", "--set", "mlflow.auth.enabled=false",
                             "--set", "mlflow.auth.namespaceUserPrefix=kubesweep-")
    assert code == 0, err


def test_the_operators_secrets_are_files_not_environment_values() -> None:
    """The operator's MLflow user and ownership key reach it as files of a read-only volume (NAME_FILE), not as
    values in its container's environment, which `kubectl exec ... env` and every process started there see."""
    code, out, err = _template("--set", "watch.namespaces={team-a}")
    assert code == 0, err
    (operator,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "Deployment"
                   and d["metadata"]["name"] == f"{RELEASE}-kubesweep-operator"]
    pod = operator["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert not [e for e in container["env"] if "secretKeyRef" in e.get("valueFrom", {})], container["env"]
    files = {e["name"]: e["value"] for e in container["env"] if e["name"].endswith("_FILE")}
    assert files == {"MLFLOW_TRACKING_USERNAME_FILE": "/etc/kubesweep-secrets/mlflow-username",
                     "MLFLOW_TRACKING_PASSWORD_FILE": "/etc/kubesweep-secrets/mlflow-password",
                     "KUBESWEEP_MLFLOW_OWNERSHIP_KEY_FILE": "/etc/kubesweep-secrets/ownership-key"}
    assert {"name": "secrets", "mountPath": "/etc/kubesweep-secrets", "readOnly": True} in container["volumeMounts"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "secrets"]
    assert volume["projected"]["defaultMode"] == 0o440 and pod["securityContext"]["fsGroup"] == 65532
