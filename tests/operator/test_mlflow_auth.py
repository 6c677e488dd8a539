"""One MLflow user per namespace, against a real `mlflow server --app-name basic-auth` whose user store the chart's
init script (charts/kubesweep/files/mlflow-auth-users.py) filled, as in the chart.

The operator, as its own user, makes each sweep's experiment for the sweep's namespace and grants that namespace's
user EDIT on it. The attacks, from a trial of namespace team-b (it holds team-b's password): write to, tag, delete
the runs and the experiment of team-a's sweep, change team-a's or the operator's password, or have the operator
grant it team-a's experiment by naming it in a Sweep. Each is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kubesweep.operator.mlflow_rest import MlflowError
from tests.support.mlflow_auth import PASSWORDS, PREFIX, AuthServer

pytestmark = pytest.mark.slow


def test_one_namespace_cannot_touch_another_namespaces_results(mlflow_auth_server: AuthServer) -> None:
    server = mlflow_auth_server
    operator = server.as_user("kubesweep-operator")
    parent_a = operator.parent_run("sweeps-a", "sweep-a", "uid-a", namespace="team-a", grant_to=PREFIX + "team-a")
    operator.parent_run("sweeps-b", "sweep-b", "uid-b", namespace="team-b", grant_to=PREFIX + "team-b")
    exp_a = operator.experiment_id("sweeps-a", "team-a")
    # team-a's trial logs a child run in its own experiment
    assert server.status("team-a", "POST", "runs/create", {"experiment_id": exp_a}) == 200
    run_a = {"run_id": parent_a}
    # team-b's trial can do none of this to team-a's sweep
    attacks = {
        "log a run in it": ("POST", "runs/create", {"experiment_id": exp_a}, 2),
        "tag its run": ("POST", "runs/set-tag", {**run_a, "key": "x", "value": "y"}, 2),
        "delete its run": ("POST", "runs/delete", run_a, 2),
        "delete its experiment": ("POST", "experiments/delete", {"experiment_id": exp_a}, 2),
        "change team-a's password": ("PATCH", "users/update-password",
                                     {"username": PREFIX + "team-a", "password": "owned"}, 2),
        "change the operator's password": ("PATCH", "users/update-password",
                                           {"username": "kubesweep-operator", "password": "owned"}, 2),
        "grant itself team-a's experiment": ("POST", "users/permissions/grant", {
            "username": PREFIX + "team-b", "resource_type": "experiment", "resource_id": exp_a,
            "permission": "MANAGE"}, 3),
    }
    answers = {what: server.status("team-b", method, path, body, version)
               for what, (method, path, body, version) in attacks.items()}
    assert answers == dict.fromkeys(attacks, 403), answers
    # a Sweep of team-b naming team-a's experiment: the operator grants nothing, and says whose it is
    with pytest.raises(MlflowError, match="experiment 'sweeps-a' belongs to the sweeps of namespace team-a"):
        operator.parent_run("sweeps-a", "sweep-b2", "uid-b2", namespace="team-b", grant_to=PREFIX + "team-b")
    assert server.status("team-b", "POST", "runs/create", {"experiment_id": exp_a}) == 403
    # each namespace still reads (default_permission READ): results are not secret between teams
    assert server.status("team-b", "GET", f"experiments/get?experiment_id={exp_a}", {}) == 200


def test_a_namespace_no_longer_served_loses_its_user(mlflow_auth_server: AuthServer) -> None:
    server = mlflow_auth_server
    (server.users_dir / "ns-team-b-password").unlink()
    try:
        assert f"user {PREFIX}team-b: deleted" in server.fill_users()
    finally:
        (server.users_dir / "ns-team-b-password").write_text(PASSWORDS["team-b"])
        server.fill_users()


def test_users_made_by_hand_are_kept_with_their_grants(mlflow_auth_server: AuthServer) -> None:
    """Under watch.allNamespaces, a namespace other than the release's is served by making its user by hand, as
    admin (docs/operator.md). MLflow's pod restarting (the init script running again) keeps that user, and so its
    grants; a user the script made for a namespace no longer served is still deleted."""
    server = mlflow_auth_server
    server.as_user("admin")._call("POST", "users/create", {"username": PREFIX + "team-c",
                                                           "password": PASSWORDS["team-c"]})
    operator = server.as_user("kubesweep-operator")
    exp = operator.experiment_id("team-c/by-hand", "team-c")
    operator.grant(exp, PREFIX + "team-c")
    assert server.status("team-c", "POST", "runs/create", {"experiment_id": exp}) == 200
    filled = server.fill_users()
    assert f"user {PREFIX}team-c: kept" in filled and f"{PREFIX}team-c: deleted" not in filled, filled
    assert server.status("team-c", "POST", "runs/create", {"experiment_id": exp}) == 200


def test_the_first_run_with_a_record_takes_the_secrets_users_as_its_own(mlflow_auth_server: AuthServer) -> None:
    """An MLflow whose users an earlier release of the chart made has no record of them: the first run takes the
    Secret's namespace users that are there as its own (and deletes them once their namespace is no longer
    served), never a user made by hand."""
    server = mlflow_auth_server
    record = Path(server.env["KUBESWEEP_MLFLOW_USERS_RECORD"])
    record.unlink(missing_ok=True)
    server.fill_users()
    assert json.loads(record.read_text())["made"] == [PREFIX + "team-a", PREFIX + "team-b"]
