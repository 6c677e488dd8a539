"""A real `mlflow server --app-name basic-auth` whose user store the chart's init script
(charts/kubesweep/files/mlflow-auth-users.py) filled, as in the chart: `admin`, the operator's user and one user per
namespace (team-a, team-b), each with its own password."""

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

from kubesweep.operator.mlflow_rest import MlflowRest, TrackingPolicy
from kubesweep.tracking.ui import free_port, mlflow_executable
from tests.support.mlflow_fixtures import quiet_mlflow_env, stop, wait_http

USERS_SCRIPT = Path(__file__).resolve().parents[2] / "charts" / "kubesweep" / "files" / "mlflow-auth-users.py"
PREFIX = "kubesweep-ns-"
OWNERSHIP_KEY = b"operator-ownership-key-0123456789"
PASSWORDS = {"admin": "admin-pw-0123", "kubesweep-operator": "operator-pw-0123",
             "team-a": "team-a-pw-0123", "team-b": "team-b-pw-0123",
             "team-c": "team-c-pw-0123"}  # team-c: not in the Secret (its user made by hand)


@dataclass
class AuthServer:
    url: str
    env: dict[str, str]
    users_dir: Path
    backend_store: str  # the server's tracking store, for MLflow's CLI (`mlflow gc`)

    def as_user(self, who: str) -> MlflowRest:
        """MLflow's REST API as `who`; as the operator, with the key that seals its experiments."""
        username = who if who in ("admin", "kubesweep-operator") else PREFIX + who
        return MlflowRest(self.url, environ={"MLFLOW_TRACKING_USERNAME": username,
                                             "MLFLOW_TRACKING_PASSWORD": PASSWORDS[who]},
                          owner_key=OWNERSHIP_KEY if who == "kubesweep-operator" else None)

    @property
    def policy(self) -> TrackingPolicy:
        """The operator's tracking policy for this server, as the chart sets it."""
        return TrackingPolicy(self.url, namespace_user_prefix=PREFIX, ownership_key=OWNERSHIP_KEY)

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


@pytest.fixture(scope="session")
def mlflow_auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthServer]:
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
           "KUBESWEEP_MLFLOW_USERS_DIR": str(users), "KUBESWEEP_MLFLOW_USERS_RECORD": str(root / "users.json")}
    port = free_port()
    store = f"sqlite:///{root / 'mlflow.db'}"
    auth = AuthServer(f"http://127.0.0.1:{port}", env, users, store)
    filled = auth.fill_users()
    assert f"user {PREFIX}team-a: created" in filled and "user kubesweep-operator: created" in filled, filled
    log = root / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([*mlflow_executable(), "server", "--app-name", "basic-auth", "--host", "127.0.0.1",
                                 "--port", str(port), "--workers", "1",
                                 "--backend-store-uri", store,
                                 "--artifacts-destination", str(root / "artifacts")],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        wait_http(f"{auth.url}/health", proc, log)
        yield auth
    finally:
        stop(proc)
