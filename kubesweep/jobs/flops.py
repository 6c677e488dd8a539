"""Model FLOPs of a BERT-style encoder, counted from its shapes and the batch shapes that ran: what TFLOP/s and MFU
(model FLOPs utilization) are computed from.

For a batch of `rows` sequences padded to `width` tokens, with hidden size d, L layers, feed-forward width f,
attention width a (heads x head size; d in BERT) and c labels, a forward pass is, in FLOPs (a multiply-add is 2):

    matmuls, per token:    L x 2 x (4 x d x a + 2 x d x f)     (Q, K, V and output projections, feed-forward)
    attention, per sequence: L x 2 x 2 x width^2 x a           (Q K^T, and the weighted sum of V)
    head, per sequence:    2 x d x d + 2 x d x c               (pooler, classifier)

The first term is 2N per token, N the matmul weights of the layers (Kaplan et al. 2020, "Scaling Laws for Neural
Language Models", section 2.1: C_forward = 2N + 2 n_layer n_ctx d_attn); the attention term counts both of
attention's matmuls over the full width, as a bidirectional encoder computes them: per token 4 L a width, the
forward third of PaLM's 12 L H Q T (Chowdhery et al. 2022, "PaLM", appendix B, which defines MFU as these model
FLOPs per second over the hardware's peak). Training is forward + backward, 3x the forward (the backward computes
the gradients of the inputs and of the weights, 2x); nothing recomputed is counted (model FLOPs, not hardware
FLOPs). Embeddings are lookups; softmax, LayerNorm, GELU, biases and the optimizer are elementwise work, left out.

Padding counts: the model computes on the padded width (the job's `padded_tokens`), so the FLOPs are the padded
shapes'. The attention term is the batch shape's own width squared, never a mean width's. Packed rows
(`padding: packed`) count the same way: their attention kernels compute the whole row's width squared, the
block-diagonal mask leaving most of it unused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TRAIN_FACTOR = 3  # forward + backward = 3 x forward


@dataclass(frozen=True)
class ModelShape:
    """The shapes of a BERT-style encoder for sequence classification that its FLOPs depend on."""

    hidden: int
    layers: int
    intermediate: int
    heads: int
    labels: int
    head_size: int | None = None  # None: hidden / heads, as BERT's

    @classmethod
    def from_config(cls, config: Any) -> ModelShape | None:
        """The shape of a Hugging Face BERT-like config (`hidden_size`, `num_hidden_layers`, `intermediate_size`,
        `num_attention_heads`, `num_labels`); None where it lacks one (a model whose FLOPs this does not count)."""
        values = [getattr(config, k, None) for k in ("hidden_size", "num_hidden_layers", "intermediate_size",
                                                       "num_attention_heads", "num_labels")]
        sizes = [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v > 0]
        if len(sizes) < len(values):
            return None
        hidden, layers, intermediate, heads, labels = sizes
        return cls(hidden, layers, intermediate, heads, labels)

    @property
    def attention_width(self) -> int:
        """Heads x head size: the width of Q, K and V (the hidden size in BERT)."""
        return self.heads * (self.head_size or self.hidden // self.heads)

    @property
    def matmul_weights(self) -> int:
        """N: the weights of the layers' matmuls (biases, LayerNorms and embeddings not counted)."""
        return self.layers * (4 * self.hidden * self.attention_width + 2 * self.hidden * self.intermediate)

    def forward_flops(self, rows: float, width: float, *, samples: float | None = None) -> float:
        """Model FLOPs of one forward pass over `rows` sequences padded to `width` tokens; packed rows hold
        `samples` sequences between them (the head runs per sample), else a row is a sample."""
        matmuls = 2 * self.matmul_weights * rows * width
        attention = 4 * self.layers * self.attention_width * rows * width * width
        head = 2 * (rows if samples is None else samples) * (self.hidden * self.hidden + self.hidden * self.labels)
        return float(matmuls + attention + head)

    def train_flops(self, rows: float, width: float, *, samples: float | None = None) -> float:
        """Model FLOPs of a training step's forward and backward over one such batch (3x the forward)."""
        return TRAIN_FACTOR * self.forward_flops(rows, width, samples=samples)


def measured_figures(flops: float | None, seconds: float, *, samples: int, tokens: float, padded: float,
                     count: int, per: str) -> dict[str, float | None]:
    """What results record beside samples/s over one measured window: tokens and padded tokens per sample, the
    window's model FLOPs (None: not counted), FLOPs per `per` (step or batch; `count` of them) and TFLOP/s."""
    return {"tokens_per_sample": tokens / samples if samples else None,
            "padded_tokens_per_sample": padded / samples if samples else None,
            "measured_flops": flops,
            f"flops_per_{per}": flops / count if flops is not None and count else None,
            "tflops_per_s": tflops_per_s(flops, seconds) if flops is not None else None}


def tflops_per_s(flops: float, seconds: float) -> float | None:
    """FLOPs over `seconds`, in TFLOP/s (None for no time)."""
    return flops / seconds / 1e12 if seconds > 0 else None


def gemm_flops(size: int) -> float:
    """FLOPs of one square matmul of `size` x `size` matrices: 2 size^3."""
    return 2.0 * size**3
