"""One MLflow user per namespace, against a real `mlflow server --app-name basic-auth` whose user store the chart's
init script (charts/kubesweep/files/mlflow-auth-users.py) filled, as in the chart.

The operator, as its own user, makes each sweep's experiment for the sweep's namespace and grants that namespace's
user EDIT on it. The attacks, from a trial of namespace team-b (it holds team-b's password): write to, tag, delete
the runs and the experiment of team-a's sweep, change team-a's or the operator's password, or have the operator
grant it team-a's experiment by naming it in a Sweep. Each is refused.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kubesweep.operator.mlflow_rest import MlflowError, MlflowRest
from kubesweep.tracking.ui import free_port, mlflow_executable
from tests.support.mlflow_fixtures import quiet_mlflow_env, stop, wait_http

pytestmark = pytest.mark.slow

USERS_SCRIPT = Path(__file__).resolve().parents[2] / "charts" / "kubesweep" / "files" / "mlflow-auth-users.py"
PREFIX = "kubesweep-ns-"
PASSWORDS = {"admin": "admin-pw-0123", "kubesweep-operator": "operator-pw-0123",
             "team-a": "team-a-pw-0123", "team-b": "team-b-pw-0123"}


@dataclass
class AuthServer:
    url: str
    env: dict[str, str]
    users_dir: Path

    def as_user(self, who: str) -> MlflowRest:
        username = who if who in ("admin", "kubesweep-operator") else PREFIX + who
        return MlflowRest(self.url, environ={"MLFLOW_TRACKING_USERNAME": username,
                                             "MLFLOW_TRACKING_PASSWORD": PASSWORDS[who]})

    def status(self, who: str, method: str, path: str, body: dict[str, object], version: int = 2) -> int:
        """The HTTP status MLflow answers, as `who` (a namespace name, or admin / kubesweep-operator)."""
        username = who if who in ("admin", "kubesweep-operator") else PREFIX + who
        request = urllib.request.Request(
            f"{self.url}/api/{version}.0/mlflow/{path}", data=json.dumps(body).encode() if body else None,
            method=method,
            headers={"Content-Type": "application/json", "Authorization": "Basic " + base64.b64encode(
                f"{username}:{PASSWORDS[who]}".encode()).decode()})
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    def fill_users(self) -> str:
        """The chart's init container: the user store holds exactly the Secret's users."""
        proc = subprocess.run([sys.executable, str(USERS_SCRIPT)], env=self.env, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthServer]:
    root = tmp_path_factory.mktemp("mlflow-auth")
    users = root / "users"  # the Secret <release>-kubesweep-mlflow-auth, as the init container mounts it
    users.mkdir()
    (users / "operator-username").write_text("kubesweep-operator")
    (users / "operator-password").write_text(PASSWORDS["kubesweep-operator"])
    for ns in ("team-a", "team-b"):
        (users / f"ns-{ns}-password").write_text(PASSWORDS[ns])
    ini = root / "basic_auth.ini"
    ini.write_text(f"[mlflow]\ndefault_permission = READ\ndatabase_uri = sqlite:///{root / 'auth.db'}\n"
                   "admin_username = admin\nadmin_password = unused-the-init-sets-it\n"
                   "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
    env = {**os.environ, **quiet_mlflow_env(), "MLFLOW_AUTH_CONFIG_PATH": str(ini),
           "MLFLOW_AUTH_ADMIN_USERNAME": "admin", "MLFLOW_AUTH_ADMIN_PASSWORD": PASSWORDS["admin"],
           "MLFLOW_FLASK_SERVER_SECRET_KEY": "test-secret-key-0123456789", "KUBESWEEP_NAMESPACE_USER_PREFIX": PREFIX,
           "KUBESWEEP_MLFLOW_USERS_DIR": str(users)}
    port = free_port()
    auth = AuthServer(f"http://127.0.0.1:{port}", env, users)
    filled = auth.fill_users()
    assert f"user {PREFIX}team-a: created" in filled and "user kubesweep-operator: created" in filled, filled
    log = root / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([*mlflow_executable(), "server", "--app-name", "basic-auth", "--host", "127.0.0.1",
                                 "--port", str(port), "--workers", "1",
                                 "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
                                 "--artifacts-destination", str(root / "artifacts")],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        wait_http(f"{auth.url}/health", proc, log)
        yield auth
    finally:
        stop(proc)


def test_one_namespace_cannot_touch_another_namespaces_results(server: AuthServer) -> None:
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


def test_a_namespace_no_longer_served_loses_its_user(server: AuthServer) -> None:
    (server.users_dir / "ns-team-b-password").unlink()
    try:
        assert f"user {PREFIX}team-b: deleted" in server.fill_users()
    finally:
        (server.users_dir / "ns-team-b-password").write_text(PASSWORDS["team-b"])
        server.fill_users()
