"""End-of-run exports, each verified by loading it back, running it once and comparing with the eager model.

- `weights` (when asked): `save_pretrained` (safetensors) plus the tokenizer, reloadable with from_pretrained.
- `onnx`: the TorchScript-based exporter (opset 17, dynamic batch and sequence axes), run with onnxruntime's
  CPU provider.
- `torchscript`: `torch.jit.trace` of the logits function, run with `torch.jit.load`.
Verification runs on the CPU in fp32 with a probe batch of real dev sentences (padded, so masks matter).
"""

from __future__ import annotations

import copy
import logging
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

ATOL = 1e-3


class _Logits:
    """A module returning only logits from (input_ids, attention_mask): the exported signature."""

    @staticmethod
    def wrap(model: Any) -> Any:
        class LogitsModule(torch.nn.Module):
            def __init__(self, inner: Any) -> None:
                super().__init__()
                self.inner = inner

            def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
                return self.inner(input_ids=input_ids, attention_mask=attention_mask).logits  # type: ignore[no-any-return]

        return LogitsModule(model).eval()


def export_all(
    model: Any, tokenizer: Any, probe: dict[str, Any], out_dir: Path, formats: list[str]
) -> list[dict[str, Any]]:
    """Export to `out_dir`; returns one record per format (failures are recorded, not raised)."""
    cpu_model = copy.deepcopy(model).to(device="cpu", dtype=torch.float32).eval()
    wrapped = _Logits.wrap(cpu_model)
    ids, mask = probe["input_ids"].cpu(), probe["attention_mask"].cpu()
    with torch.no_grad():
        expected = wrapped(ids, mask).numpy()
    records = []
    if "weights" in formats:
        records.append(
            _guard("weights", out_dir / "model", lambda p: _weights(cpu_model, tokenizer, p, ids, mask, expected))
        )
    if "onnx" in formats:
        records.append(
            _guard("onnx", out_dir / "model.onnx", lambda p: _onnx(wrapped, p, ids, mask, expected))
        )
    if "torchscript" in formats:
        records.append(
            _guard(
                "torchscript",
                out_dir / "model.torchscript.pt",
                lambda p: _torchscript(wrapped, p, ids, mask, expected),
            )
        )
    return records


def _guard(fmt: str, path: Path, fn: Any) -> dict[str, Any]:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        diff = float(fn(path))
    except Exception as err:
        log.exception("export %s failed", fmt)
        return {
            "format": fmt,
            "path": str(path),
            "verified": False,
            "max_abs_diff": None,
            "error": str(err)[:500],
        }
    ok = diff <= ATOL
    print(f"export {fmt}: {path} ({'verified' if ok else 'MISMATCH'}, max |diff| {diff:.2e})", flush=True)
    return {
        "format": fmt,
        "path": str(path),
        "verified": ok,
        "max_abs_diff": diff,
        "error": None if ok else f"outputs differ by {diff:.3g} > {ATOL}",
    }


def _weights(model: Any, tokenizer: Any, path: Path, ids: Any, mask: Any, expected: Any) -> float:
    from transformers import AutoModelForSequenceClassification

    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    reloaded = AutoModelForSequenceClassification.from_pretrained(path, local_files_only=True).eval()
    with torch.no_grad():
        got = reloaded(input_ids=ids, attention_mask=mask).logits.numpy()
    return float(np.abs(got - expected).max())


def _onnx(wrapped: Any, path: Path, ids: Any, mask: Any, expected: Any) -> float:
    import onnxruntime as ort
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            wrapped,
            (ids, mask),
            str(path),
            dynamo=False,
            input_names=["input_ids", "attention_mask"],
            output_names=["logits"],
            dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}},
            opset_version=17,
        )
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = session.run(["logits"], {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    return float(np.abs(np.asarray(got) - expected).max())


def _torchscript(wrapped: Any, path: Path, ids: Any, mask: Any, expected: Any) -> float:
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(wrapped, (ids, mask), check_trace=False)  # type: ignore[no-untyped-call]
        traced.save(str(path))
        loaded = torch.jit.load(str(path))  # type: ignore[no-untyped-call]
        got = loaded(ids, mask).numpy()
    return float(np.abs(got - expected).max())
