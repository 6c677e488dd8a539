"""kubesweep: benchmark GPU training setups as sweeps on Kubernetes or locally."""

__version__ = "0.1.0"
