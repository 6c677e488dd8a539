"""Init container of the chart's MLflow server (basic-auth app): make its user store hold exactly the users of
the Secret <release>-kubesweep-mlflow-auth, before the server starts.

- the admin user (people: the UI, user management) with MLFLOW_AUTH_ADMIN_USERNAME / MLFLOW_AUTH_ADMIN_PASSWORD;
- the trials user (trials, tuners and the operator; not an admin: it reads everything, and edits the experiments
  it creates) with KUBESWEEP_TRIALS_USERNAME / KUBESWEEP_TRIALS_PASSWORD.

Existing users get the Secret's passwords again, so rotating the Secret and restarting the pod rotates them.
"""

import os
import sys

from mlflow.server.auth.config import read_auth_config
from mlflow.server.auth.sqlalchemy_store import SqlAlchemyStore


def main() -> int:
    config = read_auth_config()
    store = SqlAlchemyStore()
    store.init_db(config.database_uri)
    users = ((os.environ["MLFLOW_AUTH_ADMIN_USERNAME"], os.environ["MLFLOW_AUTH_ADMIN_PASSWORD"], True),
             (os.environ["KUBESWEEP_TRIALS_USERNAME"], os.environ["KUBESWEEP_TRIALS_PASSWORD"], False))
    for username, password, admin in users:
        if store.has_user(username):
            store.update_user(username, password=password, is_admin=admin)
            print(f"user {username}: password set from the Secret (admin: {admin})")
        else:
            store.create_user(username, password, is_admin=admin)
            print(f"user {username}: created (admin: {admin})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
