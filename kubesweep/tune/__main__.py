"""`python -m kubesweep.tune --spec SWEEP.yaml|json --backend kubernetes --storage DIR`: run a sweep's search
(`strategy: tune` or `max_batch`) to its end; run again with the same storage, it resumes. The operator runs
this as the tuner Job of a search sweep (kubesweep.manifests.render_tuner_job); `sweep submit` runs the same
code in-process.

Tracking comes from the environment: MLFLOW_TRACKING_URI, KUBESWEEP_EXPERIMENT, KUBESWEEP_PARENT_RUN_ID.
Exit status: 0 when no trial failed, 1 otherwise, 2 for a bad spec, 4 when the backend fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from kubesweep.spec import SpecError, parse_sweep, parse_sweep_text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kubesweep.tune", description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True, type=Path, help="the Sweep (YAML or JSON)")
    parser.add_argument("--backend", choices=("local", "kubernetes"), default="kubernetes")
    parser.add_argument("--namespace", default=None)
    parser.add_argument("--storage", type=Path, required=True, help="search state directory")
    parser.add_argument("--home", type=Path, default=None, help="local backend state directory")
    args = parser.parse_args(argv)

    from kubesweep.backends import BackendError, make_backend
    from kubesweep.manifests import TRACKING_SECRET_ENV, TrackingEnv
    from kubesweep.outcomes import Outcome

    try:
        text = args.spec.read_text()
        if args.spec.suffix == ".json":
            sweep = parse_sweep(json.loads(text), source=str(args.spec), allow_unpinned=True)
        else:
            sweep = parse_sweep_text(text, source=str(args.spec), allow_unpinned=True)
    except (OSError, ValueError, SpecError) as exc:
        print(str(exc), file=sys.stderr)
        return 2
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    tracking = TrackingEnv(uri, os.environ.get("KUBESWEEP_EXPERIMENT") or sweep.experiment,
                           os.environ.get("KUBESWEEP_PARENT_RUN_ID") or None,
                           credentials_secret=os.environ.get(TRACKING_SECRET_ENV) or None) if uri else None
    try:
        backend = make_backend(args.backend, home=args.home, namespace=args.namespace, direct=True,
                               tracking=tracking)
        if sweep.spec.search.strategy == "tune":
            from kubesweep.tune.driver import run_tune

            run_tune(sweep, backend, storage=args.storage, tracking=tracking)
        elif sweep.spec.search.strategy == "max_batch":
            from kubesweep.tune.maxbatch import run_max_batch

            run_max_batch(sweep, backend, storage=args.storage, tracking=tracking)
        else:
            print(f"sweep {sweep.name!r} has no search to run (strategy {sweep.spec.search.strategy!r})",
                  file=sys.stderr)
            return 2
        status = backend.status(sweep.name)
    except BackendError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 4
    from kubesweep.views import search_lines

    found = args.storage / ("tune.json" if sweep.spec.search.strategy == "tune" else "max_batch.json")
    for line in search_lines(json.loads(found.read_text())):
        print(line)
    return 1 if any(t.outcome == Outcome.FAILED for t in status.trials) else 0


if __name__ == "__main__":
    sys.exit(main())
