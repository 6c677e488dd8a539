"""What a trial (or a search's tuner) is told about tracking: the MLflow environment variables of its pod or process.

Standard library only: the manifests, the backends, the operator and the tuner build it, and it must not pull in
MLflow or a client library.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Names the Secret with the tracking server's credentials for trials (TrackingEnv.credentials_secret); set in the
# operator by the chart, and by the operator in the tuner, which passes it on to the trial Jobs it makes.
TRACKING_SECRET_ENV = "KUBESWEEP_TRACKING_SECRET"


@dataclass(frozen=True)
class TrackingEnv:
    """What a trial needs to log into MLflow (never MLFLOW_RUN_ID: that would write into the parent run)."""

    uri: str
    experiment: str
    parent_run_id: str | None = None
    # A Secret of the trial's namespace with keys `username` and `password`: the tracking server's credentials
    # for trials (the chart's MLflow has authentication on), passed as MLflow's MLFLOW_TRACKING_USERNAME/PASSWORD.
    credentials_secret: str | None = None

    def env(self) -> list[dict[str, Any]]:
        env: list[dict[str, Any]] = [{"name": "MLFLOW_TRACKING_URI", "value": self.uri},
                                     {"name": "KUBESWEEP_EXPERIMENT", "value": self.experiment}]
        if self.parent_run_id:
            env.append({"name": "KUBESWEEP_PARENT_RUN_ID", "value": self.parent_run_id})
        if self.credentials_secret:
            env += [{"name": TRACKING_SECRET_ENV, "value": self.credentials_secret},
                    *({"name": name, "valueFrom": {"secretKeyRef": {"name": self.credentials_secret, "key": key}}}
                      for name, key in (("MLFLOW_TRACKING_USERNAME", "username"),
                                        ("MLFLOW_TRACKING_PASSWORD", "password")))]
        return env
