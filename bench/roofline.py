"""Where a profiled training step's time goes, per token and layer, against the least that time could be: what
bounds the step's MFU (model FLOPs utilization), read from `bench/step_profile.py`'s summaries.

    python bench/roofline.py DIR/summary.json [...] [--markdown OUT.md]

For a BERT layer of hidden size d and feed-forward width f, a training step's matmuls do 3 x 2 x (4d^2 + 2df) FLOPs
a token (forward and backward; `kubesweep/jobs/flops.py`), and its element-wise work (two dropout + residual +
LayerNorm blocks and a GELU) must at the least read and write, with bf16 activations and one-byte dropout masks:

    forward:   2 x 7d (read the matmul's output and the residual, write the sum, write the mask) + 4f (GELU in, out)
    backward:  2 x 11d (gradient, saved input, mask in; gradient out; the residual's gradient read and written)
               + 6f (GELU's gradient and input in, its gradient out)

58 KB a token and layer at bert-base's d = 768, f = 3,072. Those bytes at the GPU's memory bandwidth (its data
sheet's) are the least time element-wise work can take, however it is fused between matmuls; with the matmuls at
the rate they ran in the profile and attention taken as free, that gives the highest MFU the step could reach as
built (matmuls as cuBLAS runs them, element-wise work between them). The GELU kernels' own bandwidth, from their
known bytes, shows how near the memory wall the element-wise kernels already are. The bound holds where a layer's
activations outgrow the GPU's L2 cache (50 MB on an H100: batch 1,024 of SST-2's sentences is 126 MB at the GELU);
below that, L2 serves some of the bytes faster than memory.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kubesweep.jobs.flops import TRAIN_FACTOR, ModelShape

# HBM bandwidth, TB/s, from the data sheets: H100 SXM5 (HBM3) 3.35, H200 SXM (HBM3e) 4.8
BANDWIDTH_TBPS = {"NVIDIA H100 80GB HBM3": 3.35, "NVIDIA H200": 4.8}
# a summary that records no shape (older ones): bert-base's
BERT_BASE = {"hidden": 768, "layers": 12, "intermediate": 3072, "heads": 12, "labels": 2}
KINDS = ("matmul", "attention", "fused (Inductor)", "norm", "other element-wise", "optimizer", "copy")
ELEMENTWISE = ("fused (Inductor)", "norm", "other element-wise")


def least_elementwise_bytes(d: int, f: int) -> int:
    """The bytes a training step's element-wise work must move a token and layer (module docstring)."""
    return 2 * 7 * d + 4 * f + 2 * 11 * d + 6 * f


def gelu_bandwidth(summary: dict[str, Any], tokens: float, layers: int, f: int) -> float | None:
    """TB/s of the step's GELU kernels (Inductor's `..._gelu_...`: forward 4 bytes an element, forward with
    backward 6), from the profile's top kernels; None where none is among them."""
    moved, seconds = 0.0, 0.0
    for k in summary["gpu_side"].get("top", []):
        name = k["name"]
        if not name.startswith("triton_") or "gelu" not in name or "layer_norm" in name:
            continue
        per_element = 6 if "gelu_backward" in name else 4
        share = k["calls"] / (summary["batches"] * layers)  # a kernel of other shapes may take the other calls
        moved += per_element * tokens * layers * f * share
        seconds += k["us"] / 1e6
    return moved / seconds / 1e12 if seconds else None


def analyse(summary: dict[str, Any]) -> dict[str, Any]:
    shape = ModelShape(**{**BERT_BASE, **(summary.get("shape") or {})})
    d, layers, f = shape.hidden, shape.layers, shape.intermediate
    tokens = summary["rows"] * summary["padded_tokens_per_sample"]
    token_layers = tokens * layers
    by_kind = summary["gpu_side"]["by_kind"]
    ns = {k: by_kind.get(k, {}).get("us", 0.0) * 1e3 / token_layers for k in KINDS}
    matmul_flops = TRAIN_FACTOR * 2 * shape.matmul_weights / layers  # a token and layer (kubesweep/jobs/flops.py)
    product = summary["gpu"]["product"]
    bandwidth = BANDWIDTH_TBPS.get(product)
    least = least_elementwise_bytes(d, f)
    least_ns = least / (bandwidth * 1e12) * 1e9 if bandwidth else None
    peak = summary["gpu"]["peak_tflops"]
    bound = None
    if least_ns is not None and peak:
        bound = 100 * matmul_flops / ((ns["matmul"] + least_ns + ns["optimizer"]) * 1e-9) / 1e12 / peak
    return {
        "replay": summary.get("name") or summary["config"].get("padding"),
        "gpu": product,
        "samples_per_s": summary["samples_per_s"],
        "mfu_pct": summary["mfu_pct"],
        "ns_per_token_layer": {k: round(v, 1) for k, v in ns.items()},
        "elementwise_ns": round(sum(ns[k] for k in ELEMENTWISE), 1),
        "matmul_tflops": round(matmul_flops / ns["matmul"] / 1e3, 1) if ns["matmul"] else None,
        "least_elementwise_bytes": least,
        "least_elementwise_ns": round(least_ns, 1) if least_ns is not None else None,
        "gelu_tbps": round(gb, 2) if (gb := gelu_bandwidth(summary, tokens, layers, f)) else None,
        "bandwidth_tbps": bandwidth,
        "mfu_bound_pct": round(bound, 1) if bound is not None else None,
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| replay | samples/s | MFU % | ns a token and layer: matmul (its TFLOP/s) | attention | element-wise "
             "(least at the data sheet's bandwidth) | optimizer | GELU kernels' TB/s (data sheet) | MFU bound % |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        n = r["ns_per_token_layer"]
        lines.append(f"| {r['replay']} | {r['samples_per_s']:,.0f} | {r['mfu_pct']} | {n['matmul']} "
                     f"({r['matmul_tflops']}) | {n['attention']} | {r['elementwise_ns']} ({r['least_elementwise_ns']}) "
                     f"| {n['optimizer']} | {r['gelu_tbps']} ({r['bandwidth_tbps']}) | {r['mfu_bound_pct']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("summaries", nargs="+", type=Path, help="step_profile.py's summary.json files")
    parser.add_argument("--markdown", type=Path, help="also write the table here")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    rows = []
    for path in args.summaries:
        summary = json.loads(path.read_text())
        if summary["config"].get("task", "finetune") != "finetune":
            print(f"{path}: an inference replay; this reads training steps", file=sys.stderr)
            continue
        summary.setdefault("name", path.parent.name)
        rows.append(analyse(summary))
    table = markdown(rows)
    print(table, end="")
    if args.markdown:
        args.markdown.write_text(table)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
