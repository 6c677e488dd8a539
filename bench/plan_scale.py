"""Planning speed: expand a 10,000-trial sweep (goal: <= 2 s). Prints the figure.

    python bench/plan_scale.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from kubesweep.plan import plan
from kubesweep.sweep_spec import parse_sweep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5, help="timed runs")
    args = parser.parse_args()
    doc = {
        "apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "plan-scale"},
        "spec": {"matrix": {
            "gpu": ["a100-40gb", "a100-80gb", "h100-80gb", "h200", "l40s"],   # 5
            "batch_size": [8, 16, 32, 64, 128],                                 # x5
            "precision": ["fp32", "bf16"],                                      # x2
            "compile": [False, True],                                           # x2
            "learning_rate": [1e-5, 2e-5, 3e-5, 5e-5, 1e-4],                    # x5
            "max_seq_len": [64, 128, 256, 512],                                 # x4 = 2,000 cells
        }, "repeats": 5},                                                       # x5 = 10,000 trials
    }
    sweep = parse_sweep(doc)
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        p = plan(sweep)
        times.append(time.perf_counter() - start)
    n = len(p.trials)
    per_10k = [t * 10_000 / n for t in times]
    print(f"planned {n} trials; time per 10,000 trials: median {statistics.median(per_10k):.3f} s, "
          f"min {min(per_10k):.3f} s, max {max(per_10k):.3f} s over {args.repeats} runs (goal <= 2 s)")


if __name__ == "__main__":
    main()
