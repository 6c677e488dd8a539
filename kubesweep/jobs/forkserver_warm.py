"""What the fork server imports before any trial asks (kubesweep/jobs/forkserver.py): the job's modules, once, in
the server (`preload`), and on a host with an NVIDIA GPU what a trial's first compilation needs, in the spare that
waits for the next trial (`prepare`: Inductor's compile workers, `WARM_IMPORTS`). `KUBESWEEP_FORKSERVER_WARM=0`
turns preparing off.

Nothing here may ask CUDA for its devices in the server: a child forked after that cannot use CUDA (`fork_safe`).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import time

from kubesweep.jobs.forkserver_protocol import CUDA_ENV_PREFIX, show_cuda

# Imported once by the server: what every trial of the job imports. Best effort (the extras and Triton may be
# absent). Importing starts nothing: Inductor's compile workers start in a child (a spare preparing, or a trial).
PRELOAD = ("torch", "transformers", "transformers.models.bert.modeling_bert", "kubesweep.jobs.cli",
           "kubesweep.jobs.runner", "kubesweep.jobs.hf_trainer", "mlflow", "matplotlib.pyplot",
           # what torch.compile imports when a trial first compiles (the partitioner's networkx among them);
           # not torch._inductor.compile_fx nor its Triton heuristics: importing those asks CUDA for its devices,
           # after which a forked child cannot use CUDA (checked on an H100; `fork_safe` checks every start)
           "torch._inductor.codecache", "torch._functorch.aot_autograd", "torch._functorch.partitioners",
           "networkx", "triton")
# "0": the spare does not prepare for its trial while it waits (see above); default "1".
WARM_ENV = "KUBESWEEP_FORKSERVER_WARM"
# The device node that says this host has an NVIDIA GPU (tests point it at another file).
GPU_NODE_ENV = "KUBESWEEP_TEST_GPU_NODE"
# What a trial's first compilation imports beyond PRELOAD (read on an H100: 257 modules, 4.0 s): Inductor's
# compile path, its code generators, pattern passes and Dynamo's backends, each pulling in the rest.
WARM_IMPORTS = ("torch._inductor.compile_fx", "torch._inductor.codegen.triton",
                "torch._inductor.codegen.cuda_combined_scheduling", "torch._inductor.codegen.cpp_wrapper_gpu",
                "torch._inductor.codegen.memory_planning", "torch._inductor.codegen.wrapper_fxir",
                "torch._inductor.codegen.halide", "torch._inductor.codegen.mps", "torch._inductor.codegen.pallas",
                "torch._inductor.codegen.python_wrapper_mtia", "torch._inductor.codegen.cutlass.scheduling",
                "torch._inductor.codegen.cutedsl.cutedsl_scheduling", "torch._inductor.codegen.nv_universal_gemm",
                "torch._inductor.codegen.rocm.rocm_cpp_scheduling", "torch._inductor.runtime.triton_heuristics",
                "torch._inductor.fx_passes.pre_grad", "torch._inductor.fx_passes.joint_graph",
                "torch._inductor.fx_passes.post_grad", "torch._inductor.fx_passes.quantization",
                "torch._inductor.fx_passes.freezing_patterns", "torch._inductor.fx_passes.efficient_conv_bn_eval",
                "torch._inductor.fx_passes.apply_gumbel_max_trick", "torch._dynamo.backends.inductor",
                "torch._dynamo.backends.cudagraphs", "torch._dynamo.backends.distributed",
                "torch._dynamo.repro.after_dynamo", "torch._dynamo.repro.after_aot",
                "torch.distributed.tensor.experimental", "torch.export._trace", "torch.fx.experimental.validator",
                "sympy.tensor.tensor", "sympy.physics.units")


def warm_wanted() -> bool:
    """A host with an NVIDIA GPU (what the compile workers and the imports are for), unless WARM_ENV=0."""
    return os.environ.get(WARM_ENV, "1") != "0" and os.path.exists(os.environ.get(GPU_NODE_ENV, "/dev/nvidia0"))


def preload() -> None:
    """Import `PRELOAD` in the server (what fails to import is said and left to the trials); `RuntimeError` when
    that left CUDA unusable in a forked child."""
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception as err:  # an optional extra that is not installed, or broken: children import it
            print(f"forkserver: preload {name}: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
    if not fork_safe():
        raise RuntimeError("preloading left CUDA unusable in a forked child")


def fork_safe() -> bool:
    """Whether a child forked now could use CUDA: torch refuses it in a child once the parent has asked the
    driver anything (a device count is enough), which some modules do when imported."""
    torch = sys.modules.get("torch")
    if torch is None:
        return True
    if torch.cuda.is_initialized():
        return False
    pid = os.fork()
    if pid == 0:
        os._exit(3 if torch.cuda._is_in_bad_fork() else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def prepare(cuda: dict[str, str]) -> None:
    """What a trial would do first, done while the trial before it runs: with the CUDA environment `cuda` in
    place, start Inductor's compile workers and import `WARM_IMPORTS`. Says what it did on standard error."""
    start = time.monotonic()
    for key in [k for k in os.environ if k.startswith(CUDA_ENV_PREFIX)]:
        del os.environ[key]
    os.environ.update(cuda)
    workers = _start_compile_workers()
    failed = []
    for name in WARM_IMPORTS:
        try:
            importlib.import_module(name)
        except Exception:  # another torch: the trial imports what it needs itself
            failed.append(name)
    print(f"forkserver: spare {os.getpid()} prepared for {show_cuda(cuda)} in {time.monotonic() - start:.1f}s: "
          f"compile workers {'starting' if workers else 'not started'}, "
          f"{len(WARM_IMPORTS) - len(failed)} of {len(WARM_IMPORTS)} modules imported"
          + (f" (not {', '.join(failed)})" if failed else ""), file=sys.stderr, flush=True)


def _start_compile_workers() -> bool:
    """Starts Inductor's compile workers (a sidecar process and its pool) without waiting for them: a trial
    that compiles kernels uses them once they answer and compiles in its own process until then. The sidecar,
    and the workers it starts, run at niceness 10: they take the cores the running trial leaves. False where
    Triton or the pool is missing."""
    try:
        from torch._inductor.async_compile import AsyncCompile
        from torch.utils._triton import has_triton_package

        if not has_triton_package():
            return False
        AsyncCompile.warm_pool()
        sidecar = getattr(AsyncCompile.process_pool(), "process", None)
        if sidecar is not None:  # before its workers start: they inherit it
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, sidecar.pid, 10)
        AsyncCompile.use_process_pool()  # type: ignore[no-untyped-call]  # its first job starts the workers
        return True
    except Exception as err:  # a torch without Inductor's pool: the trial compiles as it would anyway
        print(f"forkserver: compile workers not started: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        return False
