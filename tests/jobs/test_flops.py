"""Model FLOPs from a model's shapes and the batch shapes that ran (kubesweep/jobs/flops.py), against numbers worked
out by hand for bert-base and against the weights of a real (tiny) BERT."""

from __future__ import annotations

import pytest

from kubesweep.jobs.flops import ModelShape, gemm_flops, tflops_per_s

BERT_BASE = ModelShape(hidden=768, layers=12, intermediate=3072, heads=12, labels=2)


def test_bert_base_forward_is_2n_per_token_plus_attention_plus_the_head() -> None:
    # N = 12 x (4 x 768 x 768 + 2 x 768 x 3072) = 12 x (2,359,296 + 4,718,592) = 84,934,656 matmul weights
    assert BERT_BASE.matmul_weights == 84_934_656
    # per token at width 128: 2N = 169,869,312, attention 4 x 12 x 768 x 128 = 4,718,592
    # per sequence: pooler 2 x 768^2 = 1,179,648, classifier 2 x 768 x 2 = 3,072
    per_sequence = 128 * (169_869_312 + 4_718_592) + 1_179_648 + 3_072
    assert per_sequence == 22_348_434_432
    assert BERT_BASE.forward_flops(32, 128) == 32 * per_sequence == 715_149_901_824
    assert BERT_BASE.train_flops(32, 128) == 3 * 715_149_901_824  # forward + backward


def test_the_attention_term_is_each_shapes_own_width_squared() -> None:
    """Two batches of widths 16 and 48 are not one of their mean width 32: attention grows with width^2."""
    two = BERT_BASE.forward_flops(8, 16) + BERT_BASE.forward_flops(8, 48)
    mean = 2 * BERT_BASE.forward_flops(8, 32)
    assert two - mean == pytest.approx(4 * 12 * 768 * 8 * (16**2 + 48**2 - 2 * 32**2))
    # at SST-2's ~21 padded tokens the attention term is ~0.5% of a token's FLOPs: 4 x 12 x 768 x 21 / 2N
    assert 4 * 12 * 768 * 21 / (2 * BERT_BASE.matmul_weights) == pytest.approx(0.0046, abs=1e-4)


def test_the_issue_figures_29669_samples_per_s_at_21_and_at_128_tokens() -> None:
    """29,669 samples/s of bert-base training on an H100: at 21 padded tokens about a third of the dense bf16 peak
    (989.4 TFLOP/s), at 128 tokens twice it."""
    at_21 = BERT_BASE.train_flops(29_669, 21) / 1e12
    at_128 = BERT_BASE.train_flops(29_669, 128) / 1e12
    assert 0.31 < at_21 / 989.4 < 0.33
    assert 1.9 < at_128 / 989.4 < 2.1


def test_shape_from_a_real_bert_config_matches_its_linear_weights() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
                                     num_labels=3, vocab_size=100)
    shape = ModelShape.from_config(config)
    assert shape == ModelShape(hidden=64, layers=2, intermediate=96, heads=4, labels=3)
    model = transformers.BertForSequenceClassification(config)
    linear = sum(m.weight.numel() for m in model.bert.encoder.modules() if type(m).__name__ == "Linear")
    assert shape.matmul_weights == linear
    head = model.bert.pooler.dense.weight.numel() + model.classifier.weight.numel()
    assert shape.forward_flops(1, 1) == 2 * linear + 4 * 2 * 64 + 2 * head


def test_a_config_without_a_shape_counts_nothing() -> None:
    class Partial:
        hidden_size = 768
        num_hidden_layers = 12

    assert ModelShape.from_config(Partial()) is None
    assert ModelShape.from_config(None) is None


def test_rates_and_gemm_arithmetic() -> None:
    assert gemm_flops(8192) == 2 * 8192**3
    assert tflops_per_s(2e12, 4.0) == 0.5
    assert tflops_per_s(1.0, 0.0) is None
