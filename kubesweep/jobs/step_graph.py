"""The whole optimizer step as one CUDA graph per batch shape (`step_graph: true`).

Forward, backward, gradient clipping, AdamW and zeroing the gradients are captured together, so a step costs
three host-to-device input copies and one graph launch, whatever the model's size: no Python, no kernel
launches, no allocator work per step. That matters for small models and batches, where launching kernels
takes longer than running them.

What stays static across replays, and why it is safe:
- parameters, gradients (allocated once by the first step, then zeroed in place inside the graph), AdamW's
  state (capturable: its step counter lives on the device) and the learning rate (a device tensor per
  parameter group, which the LR scheduler fills in place before each step);
- one set of input buffers per batch shape; the activations of all shapes' graphs share one memory pool,
  which is safe because graphs replay one at a time on one stream and nothing they allocate outlives a step
  except the loss, which is read (enqueued) before the next replay.

Per shape, the first step runs eagerly on a side stream (it compiles under torch.compile and creates the
optimizer state), the second captures the graph and replays it: both are warm-up steps. Later steps replay.

Not supported, with a clear error: CPU, DDP, fp16 (GradScaler's inf checks read the device), gradient
accumulation, and `compile: reduce-overhead` (whose own CUDA graphs cannot nest in this one).
"""

from __future__ import annotations

from typing import Any

from kubesweep.jobs import runtime
from kubesweep.jobs.config import JobConfig
from kubesweep.jobs.errors import UsageError

INPUTS = ("input_ids", "attention_mask", "labels")


def check_supported(cfg: JobConfig, *, cuda: bool, distributed: bool) -> None:
    if not cuda:
        raise UsageError("step_graph needs a CUDA GPU (it captures the step as a CUDA graph)")
    if distributed:
        raise UsageError("step_graph does not support DDP (world size > 1); use compile instead")


class StepGraphs:
    """Runs optimizer steps for one training module, capturing one CUDA graph per input shape."""

    def __init__(self, cfg: JobConfig, module: Any, params: list[Any], optimizer: Any, device: Any) -> None:
        import torch

        self.cfg = cfg
        self.module = module
        self.params = params
        self.optimizer = optimizer
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[tuple[int, ...], Any] = {}
        self.inputs: dict[tuple[int, ...], dict[str, Any]] = {}
        self.losses: dict[tuple[int, ...], Any] = {}

    def _step(self, inputs: dict[str, Any]) -> Any:
        """One full optimizer step; eager or under capture, the same kernels."""
        import torch

        with runtime.autocast(self.cfg, self.device.type, cache_enabled=False):
            loss = self.module(**inputs).loss
        loss.backward()
        if self.cfg.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm, foreach=True)
        self.optimizer.step()
        grads = [p.grad for p in self.params if p.grad is not None]
        torch._foreach_zero_(grads)
        return loss.detach().float()

    def step(self, batch: dict[str, Any], *, non_blocking: bool) -> Any:
        """Run one optimizer step on `batch` (host tensors); returns the loss as a device tensor."""
        import torch

        shape = tuple(batch["input_ids"].shape)
        static = self.inputs.get(shape)
        if static is None:
            static = {k: batch[k].to(self.device) for k in INPUTS}
            self.inputs[shape] = static
            # Warm-up on a side stream, as CUDA graph capture requires: compiles this shape and, the first
            # time, creates the gradients and the optimizer state that every graph then reuses.
            cuda: Any = torch.cuda
            side = cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                loss = self._step(static)
            torch.cuda.current_stream(self.device).wait_stream(side)
            loss.record_stream(torch.cuda.current_stream(self.device))
            return loss
        for k in INPUTS:
            static[k].copy_(batch[k], non_blocking=non_blocking)
        graph = self.graphs.get(shape)
        if graph is None:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self.losses[shape] = self._step(static)
            self.graphs[shape] = graph
        graph.replay()
        return self.losses[shape]
