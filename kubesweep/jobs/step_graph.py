"""The whole optimizer step as one CUDA graph per batch shape (`step_graph: true`).

Forward, backward, gradient clipping, AdamW and zeroing the gradients are captured together, so a step costs
a host-to-device copy per input (three; packed rows five) and one graph launch, whatever the model's size: no
Python, no kernel launches, no allocator work per step. That matters for small models and batches, where
launching kernels takes longer than running them.

What stays static across replays, and why it is safe:
- parameters; gradients, which live in one flat buffer (each parameter's `.grad` a view into it, filled in
  place by backward and zeroed in place inside the graph); AdamW's state (capturable: its step counter lives
  on the device) and the learning rate (a device tensor per parameter group, which the LR scheduler fills in
  place before each step);
- one set of input buffers per batch shape; the activations of all shapes' graphs share one memory pool,
  which is safe because graphs replay one at a time on one stream and nothing they allocate outlives a step
  except the loss, which is read (enqueued) before the next replay.

Gradient clipping works on the flat buffer: one norm, one scale.

Per shape, the first step runs eagerly (it compiles under torch.compile and creates the optimizer state) on
the stream the graph is then captured on, the second captures the graph and replays it: both are warm-up
steps. Later steps replay.

Under DDP (world size > 1) there is no DistributedDataParallel wrapper: the ranks start from rank 0's weights,
and each step is two graphs with the gradient all-reduce between them, issued eagerly: the forward and
backward (one graph per shape), one NCCL all-reduce averaging the flat gradient buffer, then clipping, AdamW
and zeroing (one graph for every shape: it touches only the parameters, gradients and optimizer state). The
collective stays outside the graphs so that every rank runs exactly one per step, whatever each rank's own
graphs are doing: a rank capturing a graph for a shape it sees the second time executes nothing, and a
collective captured there would leave the other ranks waiting for it. The all-reduce does not overlap the
backward; for bert-base it is one 440 MB transfer, about 1.5 ms over NVLink.

Not supported, with a clear error: CPU, fp16 (GradScaler's inf checks read the device), gradient
accumulation, and `compile: reduce-overhead` (whose own CUDA graphs cannot nest in this one).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as td

from kubesweep.jobs import data, runtime
from kubesweep.jobs.errors import UsageError
from kubesweep.wire.config import JobConfig


def check_supported(*, cuda: bool) -> None:
    if not cuda:
        raise UsageError("step_graph needs a CUDA GPU (it captures the step as a CUDA graph)")


def sync_from_rank0(module: Any) -> None:
    """Give every rank rank 0's parameters and buffers (what DistributedDataParallel does when it wraps)."""
    for tensor in [*module.parameters(), *module.buffers()]:
        td.broadcast(tensor.data, src=0)


class StepGraphs:
    """Runs optimizer steps for one training module, capturing one CUDA graph per input shape."""

    def __init__(self, cfg: JobConfig, module: Any, params: list[Any], optimizer: Any, device: Any,
                 world_size: int = 1) -> None:
        self.cfg = cfg
        self.module = module
        self.params = params
        self.optimizer = optimizer
        self.device = device
        self.world_size = world_size
        self.flat = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=device)
        offset = 0
        for p in params:
            p.grad = self.flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        self.pool = torch.cuda.graph_pool_handle()
        # Warm-up and capture share one stream: libraries that keep per-stream state (cuBLAS/cuBLASLt
        # workspaces) set it up during the eager warm-up, never while a graph is being captured.
        cuda: Any = torch.cuda  # Stream() is untyped
        self.stream = cuda.Stream(device)
        # shape -> graph of the whole step (one rank) or of its forward and backward (DDP)
        self.graphs: dict[tuple[tuple[int, ...], ...], Any] = {}
        self.inputs: dict[tuple[tuple[int, ...], ...], dict[str, Any]] = {}
        self.losses: dict[tuple[tuple[int, ...], ...], Any] = {}
        self.update: Any = None  # DDP: the update's graph, one for all shapes

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def _forward_backward(self, inputs: dict[str, Any]) -> Any:
        with runtime.autocast(self.cfg, self.device.type, cache_enabled=False):
            loss = self.module(**inputs).loss
        loss.backward()
        return loss.detach().float()

    def _all_reduce(self) -> None:
        """Average the gradients over the ranks: one collective on the flat buffer, on the current stream."""
        td.all_reduce(self.flat, op=td.ReduceOp.AVG)

    def _update(self) -> None:
        """Clip, AdamW, zero the gradients; eager or under capture, the same kernels."""
        if self.cfg.max_grad_norm is not None:  # clip_grad_norm_'s arithmetic, on the one buffer
            norm = torch.linalg.vector_norm(self.flat)
            self.flat.mul_(torch.clamp(self.cfg.max_grad_norm / (norm + 1e-6), max=1.0))
        self.optimizer.step()
        self.flat.zero_()

    def _step(self, inputs: dict[str, Any]) -> Any:
        """One full optimizer step on one rank."""
        loss = self._forward_backward(inputs)
        self._update()
        return loss

    def _capture(self, work: Any, *, pool: Any) -> tuple[Any, Any]:
        """Capture `work()` as a CUDA graph on the capture stream; its result's tensors are the graph's."""
        graph = torch.cuda.CUDAGraph()
        # thread_local: the DataLoader's pin-memory thread keeps calling CUDA (pinned allocations, event
        # queries) while this thread captures; in the default global mode those calls void the capture.
        with torch.cuda.graph(graph, pool=pool, stream=self.stream, capture_error_mode="thread_local"):
            result = work()
        return graph, result

    def _check_views(self) -> None:
        """Backward must have accumulated into the flat buffer's views, not replaced them."""
        for p in self.params:
            if p.grad is None or p.grad.untyped_storage().data_ptr() != self.flat.untyped_storage().data_ptr():
                raise RuntimeError("step_graph: a gradient left the flat gradient buffer (replaced, not "
                                   "accumulated in place); this model is not supported")

    def step(self, batch: dict[str, Any], *, non_blocking: bool) -> Any:
        """Run one optimizer step on `batch` (host tensors); returns the loss as a device tensor."""
        inputs = data.model_inputs(batch)
        shape = data.batch_shape(batch)
        static = self.inputs.get(shape)
        if static is None:
            static = {k: v.to(self.device) for k, v in inputs.items()}
            self.inputs[shape] = static
            # Warm-up on the capture stream, off the default one, as CUDA graph capture requires: compiles
            # this shape and, the first time, creates the optimizer state that every graph then reuses.
            current = torch.cuda.current_stream(self.device)
            self.stream.wait_stream(current)
            with torch.cuda.stream(self.stream):
                loss = self._forward_backward(static)
                if self.distributed:
                    self._all_reduce()
                self._update()
                if self.distributed and self.update is None:
                    # Its own memory pool: the forward graphs' losses, read after the update has run, live in
                    # theirs, where the update's temporaries could otherwise land.
                    self.update, _ = self._capture(self._update, pool=None)
            self._check_views()
            current.wait_stream(self.stream)
            loss.record_stream(current)
            return loss
        for k, v in inputs.items():
            static[k].copy_(v, non_blocking=non_blocking)
        graph = self.graphs.get(shape)
        if graph is None:
            work = self._forward_backward if self.distributed else self._step
            graph, self.losses[shape] = self._capture(lambda: work(static), pool=self.pool)
            self.graphs[shape] = graph
        graph.replay()
        if self.distributed:
            self._all_reduce()
            self.update.replay()
        return self.losses[shape]
