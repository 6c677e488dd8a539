"""MFU of the committed GPU results, computed after the fact from their results files.

The trial results committed under bench/results (`**/results.json` of a trial: showcase, host-bound, gpu_node runs)
were written before the job counted FLOPs. Each has `samples_per_s` and `padded_tokens_per_s` of its measured
steps (or batches), the model's hidden size and layers, its precision and its GPU's product. From those:

    width = padded_tokens_per_s / samples_per_s                       (mean padded tokens per sample)
    FLOPs/sample = kubesweep.jobs.flops.ModelShape.train_flops(1, width)   (inference: forward_flops)
    TFLOP/s = samples_per_s x FLOPs/sample / 1e12, MFU = TFLOP/s / (catalog dense peak x GPUs)

The matmul term (2N per padded token) is exact: it needs only the padded tokens. The attention term needs each
batch's own width squared, which the files do not keep; at the mean width it is a lower bound (the mean of the
squares is at least the square of the mean), and at most the max_seq_len x the mean width: `tflops_low` and
`tflops_high` bracket the figure (for bert-base on SST-2's ~21 padded tokens they differ by under 3%). The model's
feed-forward width is its results' `intermediate_size` or, in files written before the job recorded it, 4x the
hidden size (BERT's, bert-base's and MiniLM-L6's). Trials of several directories that are copies of one another
(one trial id and start time) count once.

    python bench/mfu.py --out bench/results/mfu-committed.json --markdown bench/results/mfu-committed.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kubesweep.gpus import default_catalog  # noqa: E402
from kubesweep.jobs.flops import ModelShape  # noqa: E402

RESULTS = REPO / "bench" / "results"


def shape_of(model: dict[str, Any]) -> ModelShape | None:
    hidden, layers = model.get("hidden_size"), model.get("num_hidden_layers")
    if not hidden or not layers:
        return None
    return ModelShape(hidden=hidden, layers=layers, intermediate=model.get("intermediate_size") or 4 * hidden,
                      heads=model.get("num_attention_heads") or 12, labels=model.get("num_labels") or 2)


def trial_figures(doc: dict[str, Any]) -> dict[str, Any] | None:
    """One trial's setting and its FLOPs figures, or None where it has none to give."""
    if doc.get("outcome") != "succeeded" or doc.get("device") != "cuda":
        return None
    config, inference = doc["config"], doc.get("inference")
    stats = inference or doc.get("train")
    shape = shape_of(doc.get("model") or {})
    if not stats or shape is None or not stats.get("samples_per_s") or not stats.get("padded_tokens_per_s"):
        return None
    rate, width = stats["samples_per_s"], stats["padded_tokens_per_s"] / stats["samples_per_s"]
    flops = shape.forward_flops if inference else shape.train_flops
    low = flops(1, width)
    attention_low = 4 * shape.layers * shape.attention_width * width * width * (1 if inference else 3)
    attention_high = 4 * shape.layers * shape.attention_width * width * config["max_seq_len"] * (1 if inference else 3)
    catalog = default_catalog()
    product = ((doc.get("environment") or {}).get("gpus") or [{}])[0].get("product")
    gpu = catalog.by_product(product) if product else None
    _, peak = catalog.price_and_peak(gpu, config["precision"])
    gpus = doc.get("world_size") or 1
    tflops = rate * low / 1e12
    name = config["model"].rsplit(":", 1)[-1].rstrip("/").rsplit("/", 1)[-1]
    model = f"{name} ({shape.hidden}x{shape.layers})"  # a local path's last part may not say which model it is
    setting = {"gpu": gpu or product, "task": config["task"], "model": model, "batch": config["batch_size"],
               "precision": config["precision"], "compile": str(config["compile"]),
               "compile_scope": config.get("compile_scope"), "step_graph": bool(config.get("step_graph")),
               "padding": config["padding"], "gpus": gpus}
    return {"setting": setting, "samples_per_s": rate, "padded_tokens_per_sample": width,
            "tokens_per_sample": stats["tokens_per_s"] / rate if stats.get("tokens_per_s") else None,
            "tflops_low": tflops, "tflops_high": rate * (low - attention_low + attention_high) / 1e12,
            "peak_tflops": peak * gpus if peak else None,
            "mfu_pct": 100 * tflops / (peak * gpus) if peak else None}


def collect(root: Path) -> list[dict[str, Any]]:
    """Each distinct trial's figures, with the files it was read from."""
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(root.glob("**/results.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict) or "outcome" not in doc or "trial" not in doc:
            continue  # an aggregate, not a trial's file
        figures = trial_figures(doc)
        if figures is None:
            continue
        key = (doc["trial"]["trial_id"], doc["started_at"])
        entry = seen.setdefault(key, {**figures, "files": []})
        entry["files"].append(str(path.relative_to(REPO)))
    return list(seen.values())


def cells(trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for trial in trials:
        groups[json.dumps(trial["setting"], sort_keys=True)].append(trial)
    out = []
    for members in groups.values():
        def mean(key: str, group: list[dict[str, Any]] = members) -> float | None:
            values = [m[key] for m in group if m[key] is not None]
            return statistics.fmean(values) if values else None

        dirs = sorted({f.split("/")[2] for m in members for f in m["files"]})
        out.append({**members[0]["setting"], "n": len(members), "samples_per_s": mean("samples_per_s"),
                    "tokens_per_sample": mean("tokens_per_sample"),
                    "padded_tokens_per_sample": mean("padded_tokens_per_sample"),
                    "tflops_low": mean("tflops_low"), "tflops_high": mean("tflops_high"),
                    "peak_tflops": members[0]["peak_tflops"], "mfu_pct": mean("mfu_pct"),
                    "mfu_pct_high": 100 * (mean("tflops_high") or 0) / members[0]["peak_tflops"]
                    if members[0]["peak_tflops"] else None,
                    "from": dirs})
    out.sort(key=lambda c: (c["gpu"], c["task"], c["model"], -(c["mfu_pct"] or 0)))
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    head = ["GPU", "task", "model", "batch", "precision", "compile", "step graph", "padding", "n", "samples/s",
            "tokens/sample", "padded tokens/sample", "TFLOP/s", "MFU % (dense peak)", "from"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        compile_ = r["compile"] if r["compile"] in ("False", "false") else f"{r['compile']} ({r['compile_scope']})"
        tflops = f"{r['tflops_low']:.1f} to {r['tflops_high']:.1f}"
        mfu = f"{r['mfu_pct']:.1f} to {r['mfu_pct_high']:.1f}" if r["mfu_pct"] is not None else "none (no peak)"
        lines.append("| " + " | ".join([
            str(r["gpu"]), r["task"], r["model"], str(r["batch"]), r["precision"],
            "off" if compile_ in ("False", "false") else compile_, "yes" if r["step_graph"] else "no", r["padding"],
            str(r["n"]), f"{r['samples_per_s']:,.0f}", f"{r['tokens_per_sample']:.1f}",
            f"{r['padded_tokens_per_sample']:.1f}", tflops, mfu, ", ".join(r["from"])]) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=RESULTS)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    rows = cells(collect(args.root))
    args.out.write_text(json.dumps({"command": "python bench/mfu.py " + " ".join(sys.argv[1:]),
                                    "method": __doc__, "cells": rows}, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(markdown(rows))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
