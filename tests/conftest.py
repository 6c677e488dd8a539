"""Fixtures shared across test directories (session-scoped: one MLflow server and one tracked sweep per run)."""

from tests.support.mlflow_fixtures import mlflow_server, tracked_sweep

__all__ = ["mlflow_server", "tracked_sweep"]
