"""The tuner of tests/tune/test_driver_cluster.py, in a process of its own (Ray then lives and dies with it):

    python -m tests.tune.kwok_tuner SPEC.json NAMESPACE KUBECONFIG STORAGE URI EXPERIMENT PARENT_RUN_ID SUMMARY.json

what `sweep submit --direct` runs, plus the kwok Stage annotation that keeps each trial pod Running until the
test's stand-in, having logged the trial's final metrics, ends it (as a real job exits after logging them).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kubesweep.backends.kubernetes import KubernetesBackend
from kubesweep.sweep_spec import Sweep
from kubesweep.tune.driver import run_tune
from kubesweep.wire.env import TrackingEnv
from kubesweep.wire.search import summary_json
from tests.cluster.kwok_cluster import ANNOTATION_OUTCOME


def main(argv: list[str]) -> int:
    spec, namespace, kubeconfig, storage, uri, experiment, parent, out = argv
    sweep = Sweep.model_validate(json.loads(Path(spec).read_text()))
    backend = KubernetesBackend(namespace=namespace, kubeconfig=kubeconfig,
                                pod_annotations=lambda trial: {ANNOTATION_OUTCOME: "hang"})
    tracking = TrackingEnv(uri=uri, experiment=experiment, parent_run_id=parent)
    summary = run_tune(sweep, backend, storage=Path(storage), tracking=tracking, poll_s=0.3)
    Path(out).write_text(summary_json(summary))
    backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
