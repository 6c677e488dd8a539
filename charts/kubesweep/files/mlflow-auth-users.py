"""Init container of the chart's MLflow server (basic-auth app): make its user store hold exactly the users of
the Secret <release>-kubesweep-mlflow-auth, before the server starts.

- the admin user (people: the UI, user management) with MLFLOW_AUTH_ADMIN_USERNAME / MLFLOW_AUTH_ADMIN_PASSWORD;
- the operator's user (files operator-username, operator-password): it creates each sweep's experiment, and so
  manages it, and grants the sweep's namespace's user EDIT on it;
- one user per served namespace, KUBESWEEP_NAMESPACE_USER_PREFIX + the namespace (file ns-<namespace>-password):
  what that namespace's trials and tuners log as. Not admins: with default_permission READ they read, and edit
  only the experiments they were granted.

The Secret's files are under /etc/mlflow-users. Existing users get the Secret's passwords again, so rotating the
Secret and restarting the pod rotates them. A namespace user this script made, whose namespace is no longer
served, is deleted; any other user is kept: those made by hand (the way to serve a namespace under
watch.allNamespaces), with their grants. Which namespace users it made is recorded in a file beside the user store
(KUBESWEEP_MLFLOW_USERS_RECORD); where there is no record yet, it starts with the Secret's namespace users that
exist already (made by an earlier release of the chart).
"""

import json
import os
import re
import sys
from pathlib import Path

from mlflow.server.auth.config import read_auth_config
from mlflow.server.auth.sqlalchemy_store import SqlAlchemyStore

USERS = Path(os.environ.get("KUBESWEEP_MLFLOW_USERS_DIR", "/etc/mlflow-users"))  # the Secret, mounted
RECORD = Path(os.environ.get("KUBESWEEP_MLFLOW_USERS_RECORD", "/mlflow/kubesweep-users.json"))  # on the PVC
NAMESPACE_PASSWORD = re.compile(r"^ns-([a-z0-9]([-a-z0-9]*[a-z0-9])?)-password$")


def wanted() -> list[tuple[str, str, bool]]:
    prefix = os.environ["KUBESWEEP_NAMESPACE_USER_PREFIX"]
    users = [(os.environ["MLFLOW_AUTH_ADMIN_USERNAME"], os.environ["MLFLOW_AUTH_ADMIN_PASSWORD"], True),
             ((USERS / "operator-username").read_text(), (USERS / "operator-password").read_text(), False)]
    for path in sorted(USERS.iterdir()):
        match = NAMESPACE_PASSWORD.match(path.name)
        if match:
            users.append((prefix + match.group(1), path.read_text(), False))
    return users


def made_before() -> set[str] | None:
    """The namespace users this script made, as recorded (None: no record yet)."""
    try:
        return set(json.loads(RECORD.read_text())["made"])
    except FileNotFoundError:
        return None


def record(made: set[str]) -> None:
    partial = RECORD.with_name(RECORD.name + ".new")
    partial.write_text(json.dumps({"made": sorted(made)}, indent=1) + "\n")
    partial.replace(RECORD)


def main() -> int:
    config = read_auth_config()
    store = SqlAlchemyStore()
    store.init_db(config.database_uri)
    users = wanted()
    prefix = os.environ["KUBESWEEP_NAMESPACE_USER_PREFIX"]
    made = made_before()
    if made is None:  # the first run with a record: the Secret's namespace users there are an earlier release's
        made = {u for u, _, _ in users[2:] if store.has_user(u)}
    for username, password, admin in users:
        if store.has_user(username):
            store.update_user(username, password=password, is_admin=admin)
            print(f"user {username}: password set from the Secret (admin: {admin})")
        else:
            if username.startswith(prefix) and not admin:
                made.add(username)
                record(made)  # before it is made: a run stopped on the way leaves no user of its own unrecorded
            store.create_user(username, password, is_admin=admin)
            print(f"user {username}: created (admin: {admin})")
    keep = {u for u, _, _ in users}
    for user in store.list_users():
        if user.username in keep or not user.username.startswith(prefix):
            continue
        if user.username in made:
            store.delete_user(user.username)
            made.discard(user.username)
            record(made)
            print(f"user {user.username}: deleted (its namespace is no longer served)")
        else:
            print(f"user {user.username}: kept (not made from the Secret)")
    record(made)
    return 0


if __name__ == "__main__":
    sys.exit(main())
