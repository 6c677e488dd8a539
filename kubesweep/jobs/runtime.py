"""Precision, torch.compile and the test hooks shared by the training and inference paths.

Test hooks (environment variables, for tests only; documented in docs/job.md):
- `KUBESWEEP_TEST_OOM_ABOVE_BATCH=N`: the first forward raises `torch.OutOfMemoryError` when batch_size > N,
  exercising the `oom` outcome without filling a GPU;
- `KUBESWEEP_TEST_CRASH_AFTER_STEP=K`: the process dies (exit 137, like SIGKILL) right after optimizer step K,
  to prove that a restarted job resumes exactly from its last checkpoint.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from kubesweep.jobs.errors import UsageError
from kubesweep.wire.config import CUDA_ONLY_SDPA, JobConfig

log = logging.getLogger(__name__)

OOM_HOOK_ENV = "KUBESWEEP_TEST_OOM_ABOVE_BATCH"
CRASH_HOOK_ENV = "KUBESWEEP_TEST_CRASH_AFTER_STEP"


def cpu_quota(cgroup: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPU time this process's cgroup may use, in cores (a pod's CPU limit), from cgroup v2's `cpu.max` or
    v1's CFS quota; None without one (no limit, or not in a container)."""
    try:
        quota, _, period = (cgroup / "cpu.max").read_text().strip().partition(" ")
        return None if quota == "max" else int(quota) / int(period or 100_000)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((cgroup / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((cgroup / "cpu" / "cpu.cfs_period_us").read_text())
        return quota_us / period_us if quota_us > 0 and period_us > 0 else None
    except (OSError, ValueError):
        return None


def limit_threads(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """PyTorch's intra-op threads, at most the cores the CPU limit allows.

    PyTorch sizes its pool by the cores it sees (all of the node's), not by the pod's CPU limit. With more
    threads than the quota, the CFS throttles the whole process for part of each period, and the thread that
    launches the GPU's kernels waits with the others: a launch-bound step (a small batch) ran at half speed in a
    pod of 8 CPUs on a 16-core node. Returns the thread count in use."""
    quota = cpu_quota(cgroup)
    if quota is not None and torch.get_num_threads() > max(1, int(quota)):
        torch.set_num_threads(max(1, int(quota)))
        log.info("intra-op threads: %d (the CPU limit, %.4g cores)", torch.get_num_threads(), quota)
    return int(torch.get_num_threads())


PREPARE_THREADS = 2  # intra-op threads of a trial preparing behind a running one (`few_threads`)


@contextlib.contextmanager
def few_threads(n: int = PREPARE_THREADS) -> Iterator[None]:
    """At most `n` intra-op threads inside, the pool as it was after: a trial that prepares (builds its model on
    the host) while another trial's measured steps run on the same machine leaves that trial's host thread the
    cores; a launch-bound step (eager, small batch) waits on that thread. Without it each preparing trial
    initialized bert-base's weights on every core."""
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, min(n, before)))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def setup_precision(cfg: JobConfig) -> None:
    """TF32 only where asked for: `fp32` is strict IEEE fp32 matmuls, `tf32` allows TF32 tensor cores."""
    tf32 = cfg.precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def autocast_dtype(cfg: JobConfig) -> Any:
    return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(cfg.precision)


def autocast(
    cfg: JobConfig, device_type: str, *, cache_enabled: bool = True
) -> contextlib.AbstractContextManager[Any]:
    """Autocast for bf16/fp16 (nothing otherwise); under CUDA graph capture its weight-cast cache must be off."""
    dtype = autocast_dtype(cfg)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=dtype, cache_enabled=cache_enabled)


def _autocast_output(module: Any, args: Any, output: Any) -> Any:
    """A LayerNorm's output in autocast's 16-bit type while autocast is on (training, evaluation), as it is
    otherwise (export, fp32 checks)."""
    device_type = output.device.type
    if torch.is_autocast_enabled(device_type):
        return output.to(torch.get_autocast_dtype(device_type))
    return output


def store_residual(model: Any, cfg: JobConfig) -> int:
    """`residual_precision: half`: every LayerNorm of `model` hands on its fp32 result in autocast's 16-bit type,
    so the residual stream between layers (and its gradient) is stored in that type; the norm's arithmetic stays
    fp32. The number of norms changed (none for `fp32`)."""
    if cfg.residual_precision != "half":
        return 0
    norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    if not norms:
        raise UsageError(f"residual_precision half: {type(model).__name__} has no LayerNorm to store in half")
    for norm in norms:
        norm.register_forward_hook(_autocast_output)
    return len(norms)


SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                 "math": "MATH"}


def check_attention_kernels(cfg: JobConfig, *, cuda: bool) -> None:
    if cfg.sdpa_backend in CUDA_ONLY_SDPA and not cuda:
        raise UsageError(f"sdpa_backend {cfg.sdpa_backend} needs a CUDA GPU; on the CPU use auto, math or flash")


def attention_kernels(cfg: JobConfig) -> contextlib.AbstractContextManager[Any]:
    """Restrict scaled_dot_product_attention to `sdpa_backend`'s kernels (none: PyTorch picks per call).

    The pick matters for BERT's short sequences: on an H100 at SST-2's lengths (about 16 tokens, with a
    padding mask) PyTorch prefers cuDNN's kernels, a quarter of bert-base's step time; with the
    memory-efficient ones the whole step ran 12% faster. Under torch.compile the choice is made while
    tracing. The job applies it to training, evaluation and the inference benchmark; exports are checked on
    the CPU with PyTorch's own choice.
    """
    if cfg.sdpa_backend == "auto":
        return contextlib.nullcontext()
    return sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[cfg.sdpa_backend])])


def eager() -> contextlib.AbstractContextManager[Any]:
    """Run compiled modules' original code (evaluation, export): no compilation of their own."""
    stance: contextlib.AbstractContextManager[Any] = torch.compiler.set_stance("force_eager")
    return stance


def repeated_blocks(module: Any) -> Any:
    """The model's stack of identical layers: its longest ModuleList whose children share one class."""
    stacks = [
        child
        for child in module.modules()
        if isinstance(child, torch.nn.ModuleList) and len(child) > 1 and len({type(c) for c in child}) == 1
    ]
    best = max(stacks, key=len, default=None)
    if best is None:
        raise UsageError(f"compile_scope layers: {type(module).__name__} has no stack of repeated layers")
    return best


def inductor_mode(cfg: JobConfig) -> str | None:
    """torch.compile's mode for the trial's `compile` (None: its default). Under `step_graph` the step is already
    one CUDA graph, so max-autotune keeps its autotuning and leaves Inductor's own CUDA graphs off (a graph
    recorded inside the step's capture)."""
    if not cfg.compile or cfg.compile == "default":
        return None
    if cfg.compile == "max-autotune" and cfg.step_graph:
        return "max-autotune-no-cudagraphs"
    return str(cfg.compile)


SDPA_CACHE_PREFIX = "sdpa-"


def inductor_cache_dir(cfg: JobConfig) -> str:
    """Where Inductor keeps this trial's compiled graphs: under `compile_cache_dir` (else the environment's
    TORCHINDUCTOR_CACHE_DIR, else Inductor's default), a folder for each `sdpa_backend`. The caches' keys (Inductor's
    FX graphs, AOTAutograd's) leave out which attention kernels were allowed, yet a graph traced under one choice
    calls that choice's kernel: in one shared folder, a trial asking for the memory-efficient kernels ran the cuDNN
    kernels that an earlier trial under `auto` had cached."""
    base = (cfg.compile_cache_dir or os.environ.get("TORCHINDUCTOR_CACHE_DIR")
            or os.path.join(tempfile.gettempdir(), f"torchinductor_{os.getuid()}"))
    base = os.path.abspath(os.path.expanduser(base))
    if os.path.basename(base).startswith(SDPA_CACHE_PREFIX):  # set by an earlier trial of this process
        base = os.path.dirname(base)
    return os.path.join(base, f"{SDPA_CACHE_PREFIX}{cfg.sdpa_backend}")


def compile_model(module: Any, cfg: JobConfig) -> Any:
    """torch.compile over `compile_scope`.

    `model`: the whole model with static shapes; each padded shape (one per bucket) is compiled once and
    reused. `layers`: each layer of the model's repeated stack is compiled in place (its weights and
    state_dict keys unchanged), with dynamic shapes where the padding varies them: one compilation serves all
    layers and every shape; the embeddings, classifier head and loss run eagerly around it.
    """
    if not cfg.compile:
        return module
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor_cache_dir(cfg)
    dynamo_config: Any = torch._dynamo.config
    dynamo_config.cache_size_limit = max(int(dynamo_config.cache_size_limit), 64)
    # Python floats reaching a compiled frame (dropout's p, attention's scaling) are constants of a trial. Left
    # symbolic, Dynamo traces a layer, fails to turn those floats into tensors and traces it again: the first
    # attempt's AOTAutograd graph is compiled, thrown away and never cached, so every trial paid for it.
    dynamo_config.specialize_float = True
    mode = inductor_mode(cfg)
    if cfg.compile_scope == "layers":
        # Shapes vary with the padding (dynamic, bucketed): one dynamic-shape compilation up front, rather than
        # a static one for the first shape and a dynamic one at the second.
        dynamic = None if cfg.padding == "max_length" else True
        for layer in repeated_blocks(module):
            layer.compile(mode=mode, dynamic=dynamic)
        return module
    return torch.compile(module, mode=mode, dynamic=False)


def oom_hook(batch_size: int) -> None:
    limit = os.environ.get(OOM_HOOK_ENV)
    if limit is not None and batch_size > int(limit):
        raise torch.OutOfMemoryError(
            f"test hook {OOM_HOOK_ENV}={limit}: batch {batch_size} does not fit (simulated CUDA OOM)"
        )


def crash_hook(step: int) -> None:
    at = os.environ.get(CRASH_HOOK_ENV)
    if at is not None and step == int(at):
        log.warning("test hook %s: dying after step %d", CRASH_HOOK_ENV, step)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(137)


def is_oom(err: BaseException) -> bool:
    if isinstance(err, torch.OutOfMemoryError):
        return True
    return isinstance(err, RuntimeError) and "out of memory" in str(err).lower()


def compile_cache_stats() -> dict[str, Any] | None:
    """What torch.compile found in its caches in this process: Inductor's FX graph cache and AOTAutograd's.

    `hit` is true when every compiled graph came from the cache (no compilation ran), false when any was
    compiled, None when nothing was compiled or looked up (eager runs).
    """
    if "torch" not in sys.modules:
        return None
    from torch._dynamo.utils import counters

    fx = counters["inductor"]
    aot = counters["aot_autograd"]
    stats = {
        "fx_graph_hits": int(fx["fxgraph_cache_hit"]),
        "fx_graph_misses": int(fx["fxgraph_cache_miss"]),
        "aot_autograd_hits": int(aot["autograd_cache_hit"]),
        "aot_autograd_misses": int(aot["autograd_cache_miss"]),
    }
    looked = sum(stats.values())
    if not looked:
        return None
    misses = stats["fx_graph_misses"] + stats["aot_autograd_misses"]
    return {**stats, "hit": misses == 0, "dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR")}


def free_device_memory(model: Any, *, keep: bool) -> Any:
    """Before a trial gives its GPU back: the model moves to host memory when `keep` (exports follow), else it
    is dropped; then the caching allocator returns what it holds. Returns the model (None when dropped)."""
    if "torch" not in sys.modules:
        return model if keep else None
    if model is not None and keep:
        model = model.to("cpu")
    elif not keep:
        model = None
    gc.collect()
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return model
