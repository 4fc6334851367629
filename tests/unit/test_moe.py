"""The tiny mixture of experts and its dense twins as written, and what quantload reads of an MoE:
total and active parameters, the bytes a token reads, and the experts a batch touches."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantload.errors import ModelError
from quantload.kvcache import kv_shape_from_gguf, predict_kv
from quantload.models.gguf_meta import read_gguf
from quantload.models.gguf_scan import scan_gguf
from quantload.models.moe import file_moe_facts, moe_facts, touched_share
from quantload.models.synthetic import VOCAB_FILE
from quantload.models.synthetic_moe import MoeShape, twin_feed_forward, write_dense_twin, write_tiny_moe
from quantload.roofline.weights import weight_traffic

VOCAB = 512  # tokens of the stand-in vocabulary: small, so the experts dominate the files
SHAPE = MoeShape(embedding=256, heads=4, kv_heads=2, layers=2, experts=8, experts_used=2, expert_feed_forward=256)


def _vocabulary_tree(root: Path) -> Path:
    """A llama.cpp tree whose only file is a stand-in for models/ggml-vocab-qwen2.gguf."""
    import gguf

    path = root / VOCAB_FILE
    path.parent.mkdir(parents=True)
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list([f"t{i}" for i in range(VOCAB)])
    writer.add_token_types([1] * VOCAB)
    writer.add_token_merges(["t 1"])
    for add in (writer.add_eos_token_id, writer.add_bos_token_id, writer.add_pad_token_id):
        add(VOCAB - 1)
    writer.add_chat_template("{{ messages }}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return root


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("moe")
    tree = _vocabulary_tree(root / "llama.cpp")
    return {
        "moe": write_tiny_moe(tree, root / "moe.gguf", seed=1, shape=SHAPE),
        "total": write_dense_twin(tree, root / "total.gguf", "total", seed=1, shape=SHAPE),
        "active": write_dense_twin(tree, root / "active.gguf", "active", seed=1, shape=SHAPE),
    }


def _ffn_params(path: Path) -> int:
    tensors = scan_gguf(path).tensors
    return sum(t.n_elements for name, t in tensors.items() if ".ffn_" in name and "norm" not in name and "gate_inp" not in name)


def test_the_tiny_moe_is_a_qwen3moe_with_its_experts_in_the_metadata_and_tensors(written: dict[str, Path]) -> None:
    summary = read_gguf(written["moe"])
    assert (summary.architecture, summary.file_type) == ("qwen3moe", "F16")
    assert summary.arch_value("expert_count") == 8 and summary.arch_value("expert_used_count") == 2
    assert summary.arch_value("expert_feed_forward_length") == 256
    dims = {name: t.dims for name, t in scan_gguf(written["moe"]).tensors.items()}
    assert dims["blk.0.ffn_gate_inp.weight"] == (256, 8)
    assert dims["blk.1.ffn_gate_exps.weight"] == dims["blk.1.ffn_up_exps.weight"] == (256, 256, 8)
    assert dims["blk.1.ffn_down_exps.weight"] == (256, 256, 8)
    assert dims["blk.0.attn_q_norm.weight"] == dims["blk.0.attn_k_norm.weight"] == (64,)


def test_total_and_active_parameters_come_from_the_expert_tensors(written: dict[str, Path]) -> None:
    summary = read_gguf(written["moe"])
    facts = file_moe_facts(summary)
    assert facts is not None
    per_layer_experts = 3 * 256 * 256 * 8
    assert facts.expert_params == 2 * per_layer_experts
    assert facts.total_params == summary.n_params
    assert facts.active_params == summary.n_params - facts.expert_params + facts.expert_params // 4
    assert facts.expert_bytes == 2 * facts.expert_params  # f16
    assert facts.other_bytes + facts.expert_bytes == summary.tensor_bytes


def test_the_dense_twins_hold_all_the_experts_or_the_used_ones(written: dict[str, Path]) -> None:
    facts = file_moe_facts(read_gguf(written["moe"]))
    assert facts is not None
    assert twin_feed_forward(SHAPE, "total") == 2048 and twin_feed_forward(SHAPE, "active") == 512
    assert _ffn_params(written["total"]) == facts.expert_params
    assert _ffn_params(written["active"]) == facts.expert_params // 4
    for twin in ("total", "active"):
        summary = read_gguf(written[twin])
        assert summary.architecture == "qwen3" and file_moe_facts(summary) is None
    # the router is all that the MoE has beyond its equal-total twin
    router = 2 * 256 * 8
    assert read_gguf(written["moe"]).n_params == read_gguf(written["total"]).n_params + router
    assert read_gguf(written["active"]).n_params == facts.active_params - router


def test_a_generated_token_reads_the_bytes_of_the_used_experts_only(written: dict[str, Path]) -> None:
    moe = weight_traffic(read_gguf(written["moe"]))
    active = weight_traffic(read_gguf(written["active"]))
    total = weight_traffic(read_gguf(written["total"]))
    router_bytes = 2 * 256 * 8 * 4
    assert moe.bytes_per_pass == active.bytes_per_pass + router_bytes
    assert moe.matmul_params == active.matmul_params + router_bytes // 4
    assert total.bytes_per_pass > 2.5 * active.bytes_per_pass
    # a long prompt batch routes its tokens to every expert: it reads what the total twin reads
    assert moe.bytes_for_tokens(1) == pytest.approx(moe.bytes_per_pass)
    assert moe.bytes_for_tokens(512) == pytest.approx(total.bytes_per_pass + router_bytes, rel=1e-6)
    four = moe.bytes_for_tokens(4)
    assert moe.bytes_per_pass < four < total.bytes_per_pass
    assert active.bytes_for_tokens(4) == active.bytes_per_pass  # dense: the same at any batch


def test_the_share_of_experts_a_step_touches_grows_with_its_tokens() -> None:
    assert touched_share(2, 8, 1) == pytest.approx(0.25)
    assert touched_share(2, 8, 4) == pytest.approx(1 - 0.75**4)
    shares = [touched_share(8, 128, n) for n in (1, 2, 4, 8, 64, 512)]
    assert shares == sorted(shares) and shares[-1] > 0.99
    assert touched_share(2, 8, 0) == 0.0


def test_the_kv_cache_of_the_moe_is_its_attention_alone(written: dict[str, Path]) -> None:
    shape = kv_shape_from_gguf(read_gguf(written["moe"]))
    assert (shape.n_layer, shape.n_head_kv, shape.head_dim_k, shape.head_dim_v) == (2, (2, 2), 64, 64)
    assert predict_kv(shape, 8, 4096).total_bytes == 2 * 8 * 4096 * 2 * 64 * 2 * 2


def test_experts_without_a_used_count_are_refused_in_one_line(written: dict[str, Path]) -> None:
    summary = read_gguf(written["moe"])
    broken = type(summary)(**{**summary.__dict__, "metadata": {**summary.metadata, "qwen3moe.expert_used_count": 0}})
    with pytest.raises(ModelError, match=r"8 experts but qwen3moe\.expert_used_count is 0") as caught:
        moe_facts(broken, scan_gguf(summary.path).tensor_table())
    assert "how many of its experts each token uses" in caught.value.one_line()


@pytest.mark.parametrize(
    ("change", "problem"),
    [({"experts_used": 9}, "cannot use 9 per token"), ({"expert_feed_forward": 200}, "not a multiple of 256")],
)
def test_a_shape_llama_cpp_or_the_k_quants_refuse_is_refused_before_writing(
    tmp_path: Path, change: dict[str, int], problem: str
) -> None:
    shape = MoeShape(**{**SHAPE.__dict__, **change})
    with pytest.raises(ModelError, match=problem):
        write_tiny_moe(tmp_path, tmp_path / "never.gguf", shape=shape)
    assert not (tmp_path / "never.gguf").exists()


def test_the_writer_is_deterministic_per_seed(tmp_path: Path, written: dict[str, Path]) -> None:
    tree = written["moe"].parent / "llama.cpp"
    again = write_tiny_moe(tree, tmp_path / "again.gguf", seed=1, shape=SHAPE)
    assert again.read_bytes() == written["moe"].read_bytes()
    other = write_tiny_moe(tree, tmp_path / "other.gguf", seed=2, shape=SHAPE)
    assert other.read_bytes() != again.read_bytes()
