"""Exports of a tiny random-init BERT on the CPU, each verified by running it against the eager model."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from kubesweep.jobs import export
from tests.support.job_fixtures import MINILM


@pytest.fixture(scope="module")
def tiny() -> tuple[object, object, dict[str, object]]:
    """A 1-layer, 32-wide BERT (in training mode, as training leaves it) with MiniLM's tokenizer, and a padded
    probe batch of two sentences."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from kubesweep.jobs.model import resolve

    tokenizer = AutoTokenizer.from_pretrained(resolve(MINILM).source)
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
    ))  # fmt: skip
    probe = dict(tokenizer(["a gripping , funny film .", "dull ."], padding=True, return_tensors="pt"))
    assert int(probe["attention_mask"].sum()) < probe["attention_mask"].numel()  # padded: masks matter
    return model, tokenizer, probe


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:FutureWarning")
def test_every_format_is_written_and_verified(tiny: tuple[object, object, dict[str, object]], tmp_path: Path) -> None:
    import onnxruntime as ort
    import torch
    from transformers import AutoModelForSequenceClassification

    model, tokenizer, probe = tiny
    before = {k: v.clone() for k, v in model.state_dict().items()}  # type: ignore[attr-defined]
    records = export.export_all(model, tokenizer, probe, tmp_path, ["weights", "onnx", "torchscript"])
    assert [r["format"] for r in records] == ["weights", "onnx", "torchscript"]
    for record in records:
        assert record["verified"] and record["error"] is None, record
        assert 0 <= record["max_abs_diff"] <= export.ATOL
    paths = {r["format"]: Path(r["path"]) for r in records}
    assert paths == {"weights": tmp_path / "model", "onnx": tmp_path / "model.onnx",
                     "torchscript": tmp_path / "model.torchscript.pt"}
    assert (paths["weights"] / "model.safetensors").is_file() and (paths["weights"] / "tokenizer.json").is_file()
    after = model.state_dict()  # type: ignore[attr-defined]
    assert all(torch.equal(before[k], after[k]) for k in before)  # the model given is left as it was
    assert model.training  # type: ignore[attr-defined]

    # The files stand on their own, at another batch size and length than the probe's (dynamic axes).
    ids = torch.randint(1000, 2000, (3, 11))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        want = copy.deepcopy(model).eval()(input_ids=ids, attention_mask=mask).logits.numpy()  # type: ignore[attr-defined]
        reloaded = AutoModelForSequenceClassification.from_pretrained(paths["weights"]).eval()
        assert abs(reloaded(input_ids=ids, attention_mask=mask).logits.numpy() - want).max() < 1e-4
        scripted = torch.jit.load(str(paths["torchscript"]))  # type: ignore[no-untyped-call]
        assert abs(scripted(ids, mask).numpy() - want).max() < 1e-4
    session = ort.InferenceSession(str(paths["onnx"]), providers=["CPUExecutionProvider"])
    (got,) = session.run(["logits"], {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    assert abs(got - want).max() < 1e-4


def test_no_formats_exports_nothing(tiny: tuple[object, object, dict[str, object]], tmp_path: Path) -> None:
    model, tokenizer, probe = tiny
    assert export.export_all(model, tokenizer, probe, tmp_path / "export", []) == []
    assert not (tmp_path / "export").exists()


def test_a_failed_export_is_recorded_not_raised(
    tiny: tuple[object, object, dict[str, object]], tmp_path: Path
) -> None:
    model, tokenizer, probe = tiny
    (tmp_path / "model.onnx").mkdir()  # a directory where the file must go
    (record,) = export.export_all(model, tokenizer, probe, tmp_path, ["onnx"])
    assert record["format"] == "onnx" and not record["verified"]
    assert record["max_abs_diff"] is None and record["error"]
