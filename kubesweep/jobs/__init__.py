"""The BERT benchmark job: one trial, fine-tuning or inference, as `python -m kubesweep.jobs`.

Importing this package is cheap (no torch); the heavy modules load when a trial runs.
"""
