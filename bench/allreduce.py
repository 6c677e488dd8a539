"""NCCL all-reduce bandwidth between the GPUs of one host: the interconnect figure behind the DDP scaling case.

    python -m torch.distributed.run --standalone --nproc-per-node N bench/allreduce.py [--out FILE]

Each size is all-reduced `--iters` times after `--warmup` untimed ones; rank 0 prints the mean time per call,
the algorithm bandwidth (bytes / time) and the bus bandwidth (algbw x 2(n-1)/n, NCCL's figure for how busy each
link is, comparable across GPU counts). 440 MB is bert-base's fp32 gradient, what DDP all-reduces each step.
Run with NCCL_DEBUG=INFO to see which transport NCCL picked (P2P over NVLink, or shared memory through the host).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

SIZES_MB = (25, 110, 440)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    rows = []
    for size_mb in SIZES_MB:
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.ones(size_mb * 2**20 // torch.finfo(dtype).bits * 8, dtype=dtype, device="cuda")
            for _ in range(args.warmup):
                dist.all_reduce(x)
            torch.cuda.synchronize()
            cuda: Any = torch.cuda  # Event() and nccl.version() are untyped
            start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
            start.record()
            for _ in range(args.iters):
                dist.all_reduce(x)
            end.record()
            torch.cuda.synchronize()
            seconds = start.elapsed_time(end) / 1000 / args.iters
            algbw = x.numel() * x.element_size() / seconds / 1e9
            rows.append({"size_mb": size_mb, "dtype": str(dtype).removeprefix("torch."), "ms": round(seconds * 1e3, 3),
                         "algbw_gbps": round(algbw, 1), "busbw_gbps": round(algbw * 2 * (world - 1) / world, 1)})
            if rank == 0:
                print(f"[allreduce] {world} GPUs {size_mb} MB {rows[-1]['dtype']}: {rows[-1]['ms']} ms, "
                      f"algbw {rows[-1]['algbw_gbps']} GB/s, busbw {rows[-1]['busbw_gbps']} GB/s", flush=True)
    if rank == 0 and args.out:
        nccl = ".".join(map(str, cuda.nccl.version()))
        report = {"gpus": world, "device": torch.cuda.get_device_name(), "nccl": nccl, "rows": rows}
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
