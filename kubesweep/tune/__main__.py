"""`python -m kubesweep.tune --spec SWEEP.yaml|json --backend kubernetes --storage DIR`: run a sweep's search
(`strategy: tune` or `max_batch`, or sequential repeats) to its end; run again with the same storage, it resumes.
The operator runs this as the tuner Job of a search sweep (kubesweep.manifests.render_tuner_job); `sweep submit`
runs the same code in-process.

Tracking comes from the environment: MLFLOW_TRACKING_URI, KUBESWEEP_EXPERIMENT, KUBESWEEP_PARENT_RUN_ID.
Exit status: 0 when no trial failed, 1 otherwise, 2 for a bad spec, 4 when the backend fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from kubesweep.backend_factory import BACKENDS, Flags, KubernetesConfig, configure, make_backend
from kubesweep.backends.base import BackendError
from kubesweep.cli.search_view import search_lines
from kubesweep.session import EXIT_BACKEND, EXIT_USAGE, exit_code
from kubesweep.sweep_spec import SpecError, parse_sweep, parse_sweep_text
from kubesweep.sweep_spec.file import read_spec_text
from kubesweep.tune.dispatch import NoSearch, run_search
from kubesweep.wire.env import TRACKING_SECRET_ENV, TrackingEnv


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kubesweep.tune", description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True, type=Path, help="the Sweep (YAML or JSON)")
    parser.add_argument("--backend", choices=BACKENDS, default=KubernetesConfig.name)
    parser.add_argument("--namespace", default=None)
    parser.add_argument("--storage", type=Path, required=True, help="search state directory")
    parser.add_argument("--home", type=Path, default=None, help="local backend state directory")
    args = parser.parse_args(argv)

    try:
        text = read_spec_text(args.spec)  # within the size limit of a spec file
        if args.spec.suffix == ".json":
            sweep = parse_sweep(json.loads(text), source=str(args.spec), allow_unpinned=True)
        else:
            sweep = parse_sweep_text(text, source=str(args.spec), allow_unpinned=True)
    except SpecError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_USAGE
    except (ValueError, RecursionError) as exc:  # not JSON, or nested past what json reads
        print(f"{args.spec}: not valid JSON: {exc}", file=sys.stderr)
        return EXIT_USAGE
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    tracking = TrackingEnv(uri, os.environ.get("KUBESWEEP_EXPERIMENT") or sweep.experiment,
                           os.environ.get("KUBESWEEP_PARENT_RUN_ID") or None,
                           credentials_secret=os.environ.get(TRACKING_SECRET_ENV) or None) if uri else None
    try:
        backend = make_backend(configure(args.backend, Flags(home=args.home, namespace=args.namespace,
                                                             direct=True)), tracking)
        summary = run_search(sweep, backend, storage=args.storage, tracking=tracking)
        status = backend.status(sweep.name)
    except NoSearch as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_USAGE
    except BackendError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BACKEND
    for line in search_lines(summary):
        print(line)
    return exit_code(status)


if __name__ == "__main__":
    sys.exit(main())
