"""Whose an MLflow experiment is, as the operator decides it, against a real `mlflow server --app-name basic-auth`
with the chart's users (tests/support/mlflow_auth.py).

MLflow's users can create experiments (and then manage them: grant anyone, the operator included, any right on
them), and a namespace's user may rename and retag the experiments the operator granted it. Each attack here uses
only that to make the operator take an experiment for another namespace's sweep, so that the attacker can write
into that sweep's runs; each is refused (`ExperimentRefused`: the Sweep is Invalid), nothing is granted, no parent
run is made. Ownership rests on the operator's seal (`kubesweep.operator.ownership`), never on a name or a tag.
"""

from __future__ import annotations

import subprocess

import pytest

from kubesweep.operator.mlflow_rest import ExperimentRefused, MlflowRest
from kubesweep.tracking.ui import mlflow_executable
from kubesweep.wire import tags
from tests.support.mlflow_auth import PASSWORDS, PREFIX, AuthServer

pytestmark = pytest.mark.slow
NOT_MADE = "was not made by the operator for namespace team-b"


def _sweep(server: AuthServer, namespace: str, experiment: str, uid: str) -> str:
    """What the operator does for a new Sweep of `namespace` naming `experiment`: its parent run's id."""
    name = server.policy.experiment_name(server.url, namespace, experiment)
    return server.as_user("kubesweep-operator").parent_run(name, experiment, uid, namespace=namespace,
                                                           grant_to=PREFIX + namespace)


def _create_as(server: AuthServer, who: str, name: str, tags: dict[str, str]) -> str:
    """`who` creates an experiment (which it then manages) and lets the operator manage it too."""
    rest = server.as_user(who)
    exp = str(rest._call("POST", "experiments/create", {
        "name": name, "tags": [{"key": k, "value": v} for k, v in tags.items()]})["experiment_id"])
    rest.grant(exp, "kubesweep-operator", "MANAGE")
    return exp


def _tags(rest: MlflowRest, exp: str) -> dict[str, str]:
    found = rest._call("GET", "experiments/get", query={"experiment_id": exp})["experiment"]
    return {t["key"]: t["value"] for t in found.get("tags") or []}


def _refused(server: AuthServer, name: str, exp: str, uid: str, match: str = NOT_MADE) -> None:
    """team-b's Sweep naming `name` is refused, and team-b's user got nothing on the experiment `exp`."""
    with pytest.raises(ExperimentRefused, match=match):
        _sweep(server, "team-b", name, uid)
    runs = server.as_user("admin")._call("POST", "runs/search", {"experiment_ids": [exp]}).get("runs") or []
    assert not [r for r in runs if any(t["key"] == "kubesweep.sweep-uid" and t["value"] == uid
                                       for t in r["data"].get("tags", []))], "a parent run was made"
    assert server.status("team-b", "POST", "runs/create", {"experiment_id": exp}) == 403


def test_the_two_namespaces_sweeps_of_one_name_get_two_experiments(mlflow_auth_server: AuthServer) -> None:
    server = mlflow_auth_server
    run_a, run_b = _sweep(server, "team-a", "same-name", "uid-same-a"), _sweep(server, "team-b", "same-name",
                                                                               "uid-same-b")
    admin = server.as_user("admin")
    exp_a = admin._call("GET", "runs/get", query={"run_id": run_a})["run"]["info"]["experiment_id"]
    exp_b = admin._call("GET", "runs/get", query={"run_id": run_b})["run"]["info"]["experiment_id"]
    assert exp_a != exp_b
    assert server.status("team-a", "POST", "runs/create", {"experiment_id": exp_b}) == 403
    # the namespace's next sweep of that name finds its own experiment again
    again = _sweep(server, "team-b", "same-name", "uid-same-b2")
    assert admin._call("GET", "runs/get", query={"run_id": again})["run"]["info"]["experiment_id"] == exp_b


def test_an_experiment_made_and_tagged_for_another_namespace_is_refused(mlflow_auth_server: AuthServer) -> None:
    """team-a makes the experiment team-b's next sweep will ask for, tags it as team-b's and lets the operator
    manage it: were it taken, team-a (its manager) could overwrite team-b's metrics, retag or delete its parent run
    and revoke team-b."""
    server = mlflow_auth_server
    name = server.policy.experiment_name(server.url, "team-b", "bert-sweep")
    exp = _create_as(server, "team-a", name, {tags.NAMESPACE: "team-b"})
    _refused(server, "bert-sweep", exp, "uid-forged-tag")


def test_an_experiment_renamed_and_retagged_by_its_namespace_stays_its_own(mlflow_auth_server: AuthServer) -> None:
    """team-a, with nothing but its EDIT on its own sweep's experiment, renames it to the name team-b's next sweep
    will ask for and tags it as team-b's: were it taken, team-a could log into and tag team-b's runs."""
    server = mlflow_auth_server
    run_a = _sweep(server, "team-a", "a-sweep", "uid-rename-a")
    operator = server.as_user("kubesweep-operator")
    exp = operator._call("GET", "runs/get", query={"run_id": run_a})["run"]["info"]["experiment_id"]
    taken = server.policy.experiment_name(server.url, "team-b", "next-sweep")
    assert server.status("team-a", "POST", "experiments/update", {"experiment_id": exp, "new_name": taken}) == 200
    assert server.status("team-a", "POST", "experiments/set-experiment-tag", {
        "experiment_id": exp, "key": tags.NAMESPACE, "value": "team-b"}) == 200
    _refused(server, "next-sweep", exp, "uid-rename-b")
    # it is still team-a's, and only team-a's, to log into
    assert server.status("team-a", "POST", "runs/create", {"experiment_id": exp}) == 200


def test_a_seal_copied_from_another_experiment_is_no_seal(mlflow_auth_server: AuthServer) -> None:
    """The tag-forged ownership record: team-a reads the seal of a genuine team-b experiment (every user reads
    every experiment) and copies it, with the namespace tag, onto an experiment it made under team-b's next name."""
    server = mlflow_auth_server
    run_b = _sweep(server, "team-b", "genuine", "uid-genuine-b")
    operator = server.as_user("kubesweep-operator")
    genuine = operator._call("GET", "runs/get", query={"run_id": run_b})["run"]["info"]["experiment_id"]
    copied = {k: v for k, v in _tags(operator, genuine).items() if k.startswith("kubesweep.")}
    assert tags.OWNER_SEAL in copied
    name = server.policy.experiment_name(server.url, "team-b", "copied-seal")
    exp = _create_as(server, "team-a", name, copied)
    _refused(server, "copied-seal", exp, "uid-copied-seal")


def test_a_name_freed_and_taken_again_is_not_the_old_experiment(mlflow_auth_server: AuthServer) -> None:
    """team-b's experiment is renamed away by an admin (an archive), freeing its name; team-a makes a new one under
    the name, with every tag of the old one, seal included. team-b's next sweep of that name is refused: the
    name, like the tags, is not the record."""
    server = mlflow_auth_server
    run_b = _sweep(server, "team-b", "archived", "uid-archived-1")
    admin = server.as_user("admin")
    old = admin._call("GET", "runs/get", query={"run_id": run_b})["run"]["info"]["experiment_id"]
    name = server.policy.experiment_name(server.url, "team-b", "archived")
    admin._call("POST", "experiments/update", {"experiment_id": old, "new_name": name + "-2025"})
    copied = {k: v for k, v in _tags(admin, old).items() if k.startswith("kubesweep.")}
    exp = _create_as(server, "team-a", name, copied)
    _refused(server, "archived", exp, "uid-archived-2")


def test_a_namespace_cannot_rename_another_namespaces_experiment(mlflow_auth_server: AuthServer) -> None:
    """team-a cannot rename the experiment the operator made for team-b (to take its name, or give it team-a's
    next one): it may read it, nothing more. An experiment team-b renamed itself stays team-b's: team-a's sweep
    asking for that name is refused, saying whose it is."""
    server = mlflow_auth_server
    run_b = _sweep(server, "team-b", "b-own", "uid-b-own")
    exp = server.as_user("admin")._call("GET", "runs/get", query={"run_id": run_b})["run"]["info"]["experiment_id"]
    a_name = server.policy.experiment_name(server.url, "team-a", "a-next")
    assert server.status("team-a", "POST", "experiments/update", {"experiment_id": exp, "new_name": a_name}) == 403
    assert server.status("team-b", "POST", "experiments/update", {"experiment_id": exp, "new_name": a_name}) == 200
    assert server.status("team-b", "POST", "experiments/set-experiment-tag", {
        "experiment_id": exp, "key": tags.NAMESPACE, "value": "team-a"}) == 200
    with pytest.raises(ExperimentRefused, match="was not made by the operator for namespace team-a"):
        _sweep(server, "team-a", "a-next", "uid-a-next")
    assert server.status("team-a", "POST", "runs/create", {"experiment_id": exp}) == 403


def test_a_seal_copied_onto_an_experiment_that_took_its_id_again_is_no_seal(mlflow_auth_server: AuthServer) -> None:
    """The replayed seal: team-b's experiment is deleted and collected (`mlflow gc`, MLflow's own CLI on the
    server's store); SQLite gives its id to the next experiment made, which team-a makes under team-b's next name,
    with every tag of the old one, seal included. The id is the old one's, the creation time is not: refused."""
    server = mlflow_auth_server
    run_b = _sweep(server, "team-b", "collected", "uid-collected-1")
    admin = server.as_user("admin")
    old = admin._call("GET", "runs/get", query={"run_id": run_b})["run"]["info"]["experiment_id"]
    copied = {k: v for k, v in _tags(admin, old).items() if k.startswith("kubesweep.")}
    admin._call("POST", "experiments/delete", {"experiment_id": old})
    env = {**server.env, "MLFLOW_TRACKING_URI": server.url, "MLFLOW_TRACKING_USERNAME": "admin",
           "MLFLOW_TRACKING_PASSWORD": PASSWORDS["admin"]}  # its runs' artifacts are behind the server's proxy
    gc = subprocess.run([*mlflow_executable(), "gc", "--backend-store-uri", server.backend_store,
                         "--experiment-ids", old], env=env, capture_output=True, text=True, timeout=180, check=False)
    assert gc.returncode == 0, gc.stderr[-3000:]
    exp = _create_as(server, "team-a", server.policy.experiment_name(server.url, "team-b", "next-r1"), copied)
    assert exp == old and _tags(admin, exp)[tags.OWNER_SEAL] == copied[tags.OWNER_SEAL]  # the replay, as set up
    with pytest.raises(ExperimentRefused, match=NOT_MADE):
        _sweep(server, "team-b", "next-r1", "uid-collected-2")
    runs = admin._call("POST", "runs/search", {"experiment_ids": [exp]}).get("runs") or []
    assert runs == [], "a parent run was made in team-a's experiment"
