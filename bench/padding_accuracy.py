"""What padding costs in accuracy and buys in speed: one epoch of SST-2 on bert-base shapes (random init), the
same recipe under each padding, a few seeds each, against HF Trainer (dynamic padding) in the same run.

`bucketed:M` groups sentences by their length rounded up to M tokens, so a batch holds one length class and the
run sees few shapes (each compiled once); `dynamic` pads a random batch to its longest sentence. Fine buckets
pad least, but every batch is then made of sentences of one length: on SST-2, whose phrases are mostly short,
41% of the batches at M = 8 hold only phrases of 8 tokens or fewer.

    python bench/padding_accuracy.py --sst2 DIR --tokenizer DIR --out bench/results/padding_accuracy-h100.json

Each run is a `python -m kubesweep.jobs` process. `--budget-s N` starts no run after N seconds and exits 3: run
the same command again to go on (runs already in --out are kept, not repeated).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from job_vs_hf import environment, run_job, save

RECIPE = {"task": "finetune", "model": "bert-base-uncased", "random_init": True, "epochs": 1, "batch_size": 256,
          "precision": "bf16", "max_seq_len": 128, "learning_rate": 1e-4, "warmup_ratio": 0.06,
          "num_workers": 2, "eval_every_epoch": False, "log_every": 10}
KUBESWEEP = {"compile": "default", "compile_scope": "layers", "sdpa_backend": "efficient"}
PEER = {"engine": "hf-trainer", "padding": "dynamic"}


def padding_settings(name: str) -> dict[str, Any]:
    """`dynamic`, `max_length` or `bucketed:M` as job settings."""
    kind, _, multiple = name.partition(":")
    if kind == "bucketed":
        return {"padding": "bucketed", "bucket_multiple": int(multiple or 16)}
    if kind in ("dynamic", "max_length") and not multiple:
        return {"padding": kind}
    raise argparse.ArgumentTypeError(f"padding {name!r}: expected dynamic, max_length or bucketed:M")


def figures(run: dict[str, Any]) -> dict[str, Any]:
    r = run["results"]
    train = r["train"]
    curve = [p["loss"] for p in r.get("loss_curve") or []]
    tenth = max(1, len(curve) // 10)
    return {
        "final_accuracy": r.get("final_accuracy"),
        "samples_per_s": round(train["samples_per_s"], 1),
        "padded_per_real_token": round(train["padded_tokens_per_s"] / train["tokens_per_s"], 3),
        "measured_train_s": round(train["measured_time_s"], 2),
        "warmup_s": round(train["warmup_time_s"], 2),
        "loss_every_tenth": [round(statistics.fmean(curve[i : i + tenth]), 3) for i in range(0, len(curve), tenth)],
        "command": run["command"],
    }


def summary(runs: dict[str, dict[str, Any]], variants: list[str]) -> list[dict[str, Any]]:
    rows = []
    peer_rates = [f["samples_per_s"] for label, f in runs.items() if label.startswith("hf-trainer ")]
    peer_rate = statistics.fmean(peer_rates) if peer_rates else None
    for variant in variants:
        done = [f for label, f in runs.items() if label.rsplit(" seed ", 1)[0] == variant]
        if not done:
            continue
        accuracy = [f["final_accuracy"] for f in done]
        rate = statistics.fmean(f["samples_per_s"] for f in done)
        rows.append({
            "variant": variant, "n": len(done), "accuracy": accuracy,
            "accuracy_mean": round(statistics.fmean(accuracy), 4),
            "samples_per_s": round(rate, 1),
            "padded_per_real_token": done[0]["padded_per_real_token"],
            "speed_vs_peer": round(rate / peer_rate, 2) if peer_rate else None,
        })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sst2", type=Path, required=True, help="directory of SST-2's train.tsv/dev.tsv")
    parser.add_argument("--tokenizer", help="tokenizer directory (default: the job's, from the hub)")
    parser.add_argument("--padding", type=lambda v: [p.strip() for p in v.split(",")],
                        default=["dynamic", "bucketed:8", "bucketed:16", "bucketed:32"],
                        help="kubesweep paddings, comma-separated (default dynamic,bucketed:8,bucketed:16,bucketed:32)")
    parser.add_argument("--seeds", type=lambda v: [int(s) for s in v.split(",")], default=[42, 7],
                        help="seeds of every variant, comma-separated (default 42,7)")
    parser.add_argument("--no-peer", action="store_true", help="leave HF Trainer out")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a job setting of kubesweep's runs (VALUE as JSON, else a string), e.g. "
                             "sdpa_backend=math; named in each run's label")
    parser.add_argument("--budget-s", type=float, default=None, help="start no run after this many seconds")
    parser.add_argument("--out", type=Path, required=True, help="results JSON")
    args = parser.parse_args()
    for name in args.padding:
        try:
            padding_settings(name)
        except argparse.ArgumentTypeError as err:
            parser.error(str(err))

    overrides: dict[str, Any] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set {item}: expected KEY=VALUE")
        try:
            overrides[key] = json.loads(value)
        except ValueError:
            overrides[key] = value
    suffix = "".join(f" [{k}={v}]" for k, v in overrides.items())
    base = {**RECIPE, "dataset": str(args.sst2.resolve()), **({"tokenizer": args.tokenizer} if args.tokenizer else {})}
    variants = [f"kubesweep {p}{suffix}" for p in args.padding] + ([] if args.no_peer else ["hf-trainer dynamic"])
    report: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    report.update({"command": shlex.join([Path(sys.executable).name, *sys.argv]), "environment": environment(),
                   "recipe": {**RECIPE, "kubesweep": KUBESWEEP}})
    runs: dict[str, dict[str, Any]] = report.setdefault("runs", {})
    logs = args.out.parent / (args.out.stem + "-logs")
    start = time.monotonic()
    for seed in args.seeds:  # seed-major: an interrupted run has every variant of the first seed
        for variant in variants:
            label = f"{variant} seed {seed}"
            if label in runs:
                continue
            if args.budget_s is not None and time.monotonic() - start > args.budget_s:
                print(f"budget of {args.budget_s:.0f} s spent: run the same command again to go on", flush=True)
                sys.exit(3)
            engine, padding = variant.removesuffix(suffix).split(" ", 1)
            settings = {**base, "seed": seed, **(PEER if engine == "hf-trainer" else
                                                  {**KUBESWEEP, **padding_settings(padding), **overrides})}
            name = "".join(c for c in label.replace(" ", "-") if c.isalnum() or c in "-_.")
            f = figures(run_job(settings, label=name, log_dir=logs))
            runs[label] = f
            print(f"{label}: accuracy {f['final_accuracy']:.4f}, {f['samples_per_s']:.0f} samples/s, "
                  f"{f['padded_per_real_token']:.2f} padded tokens per token, warm-up {f['warmup_s']} s", flush=True)
            report["summary"] = summary(runs, variants)
            save(args.out, report)
    report["summary"] = summary(runs, variants)
    save(args.out, report)
    for row in report["summary"]:
        ratio = f", {row['speed_vs_peer']}x the peer" if row["speed_vs_peer"] else ""
        print(f"{row['variant']:>22}: accuracy {row['accuracy_mean']:.3f} "
              f"({', '.join(f'{a:.3f}' for a in row['accuracy'])}), {row['samples_per_s']:.0f} samples/s{ratio}")


if __name__ == "__main__":
    main()
