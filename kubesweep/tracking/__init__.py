"""Experiment tracking (MLflow): the per-trial logger used inside the job; sweep-level runs and reports."""
