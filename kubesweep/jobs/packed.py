"""Sequence classification on packed rows (`padding: packed`): several sentences share a row of `max_seq_len`
tokens, so a step computes on about the tokens it has rather than on padding.

Each sentence sees only itself: the attention mask is block-diagonal (a token attends to the tokens of its own
sentence; padding attends to padding, never to a sentence), its positions start at 0 as if it were alone, and its
[CLS] token's final hidden state goes through the model's own pooler and classifier. So the logits of a packed
sentence are those of the same sentence run alone (tests/jobs/test_packed.py compares them), and the weights are
the model's own: evaluation, checkpoints and exports use the model as it is.

The mask is a dense (rows, 1, width, width) boolean: PyTorch's memory-efficient and math attention kernels take
it; flash attention takes no mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class PackedOutput:
    loss: Any
    logits: Any


def block_mask(segment_ids: Any) -> Any:
    """(rows, 1, width, width), True where a query token may attend to a key token: the same sentence of the
    same row (padding, sentence 0, with padding only)."""
    return segment_ids[:, None, :, None] == segment_ids[:, None, None, :]


class PackedClassifier(torch.nn.Module):
    """A Hugging Face BERT-style `...ForSequenceClassification` (`.bert`, `.dropout`, `.classifier`) called on
    packed rows; its parameters are the model's."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model
        encoder = getattr(model, "bert", None)
        if encoder is None or getattr(encoder, "pooler", None) is None or not hasattr(model, "classifier"):
            raise TypeError(f"padding packed needs a BERT-style classifier (bert, pooler, classifier); "
                            f"{type(model).__name__} is not one")
        self.config = model.config

    def forward(self, input_ids: Any, position_ids: Any, segment_ids: Any, cls_index: Any,
                labels: Any | None = None) -> PackedOutput:
        model = self.model
        # the embeddings and the encoder, not the whole `bert`: its pooler would also run on each row's first token
        embedded = model.bert.embeddings(input_ids=input_ids, position_ids=position_ids,
                                         token_type_ids=torch.zeros_like(input_ids))
        hidden = model.bert.encoder(embedded, attention_mask=block_mask(segment_ids)).last_hidden_state
        first = hidden.reshape(-1, hidden.shape[-1]).index_select(0, cls_index)
        pooler = model.bert.pooler
        pooled = pooler.activation(pooler.dense(first))
        logits = model.classifier(model.dropout(pooled))
        loss = torch.nn.functional.cross_entropy(logits.float(), labels) if labels is not None else None
        return PackedOutput(loss=loss, logits=logits)
