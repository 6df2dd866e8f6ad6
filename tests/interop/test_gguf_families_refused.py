"""What a GGUF file means is what llama.cpp computes from it: keys llama.cpp hard-codes or ignores are read its
way, what scratchlm cannot compute is refused by name (never loaded as a different model), and an export that
llama.cpp would run differently is refused, naming why for each architecture.

The files are tiny scratchlm exports (read back with read_gguf) whose metadata / tensor list is then changed
in memory and read with metadata_config.config_fields; one llama.cpp run shows a key it ignores.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import transformers

from gguf_helpers import build_family_model, tokenizer_metadata, write_gguf
from scratchlm.config import ModelConfig
from scratchlm.interop.gguf.metadata_config import config_fields
from scratchlm.interop.gguf.model_load import load_gguf
from scratchlm.interop.gguf.reader import read_gguf
from scratchlm.interop.gguf.writer import save_gguf
from scratchlm.interop.hf.config_json import config_from_hf
from scratchlm.model import TransformerLM

import llama_cpp  # in the test extra (pinned)

TINY = dict(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, bos_token_id=None, eos_token_id=None, pad_token_id=None)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1, mlp_only_layers=[])
BASES = {  # family -> transformers config class and kwargs
    "llama": ("LlamaConfig", {}), "qwen2": ("Qwen2Config", {}),
    "gemma2": ("Gemma2Config", {"head_dim": 16, "query_pre_attn_scalar": 16}),
    "gemma3": ("Gemma3TextConfig", {"head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 8}),
    "phi3": ("Phi3Config", {}), "granite": ("GraniteConfig", {}),
    "smollm3": ("SmolLM3Config", {"num_hidden_layers": 4}), "qwen2_moe": ("Qwen2MoeConfig", MOE),
    "qwen3_moe": ("Qwen3MoeConfig", {**MOE, "norm_topk_prob": True, "head_dim": 16}),
}


def scratch_config(config_cls: str, **kwargs) -> ModelConfig:
    return config_from_hf(getattr(transformers, config_cls)(**{**TINY, **kwargs}).to_dict())


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """family -> the read_gguf contents of its tiny F32 export."""
    d = tmp_path_factory.mktemp("refused")
    torch.manual_seed(0)
    out = {}
    for family, (cls, kw) in BASES.items():
        path = save_gguf(TransformerLM(scratch_config(cls, **kw)), d / f"{family}.gguf", type_name="F32")
        out[family] = read_gguf(path)
    return out


def fields(contents, meta=None, drop_meta=(), tensors=None, drop=(), rope=None):
    """config_fields of a file with metadata keys set / dropped and tensors (name -> shape) added / dropped."""
    metadata = {k: v for k, v in contents.metadata.items() if k not in drop_meta}
    metadata.update(meta or {})
    shapes = {n: t.shape for n, t in contents.tensors.items() if n not in drop}
    shapes.update(tensors or {})
    if rope is None:
        rope = {n: t.dequantize() for n, t in contents.tensors.items() if n.startswith("rope_")}
    return config_fields(metadata, shapes, rope)


REFUSED = [  # (base, changes, what the error names)
    ("qwen2", dict(tensors={"output.bias": (64,)}), "output.bias .*LM-head bias"),
    ("qwen2", dict(tensors={"blk.0.attn_output.bias": (64,)}), "blk.0.attn_output.bias .*'qwen2'"),
    ("llama", dict(tensors={"blk.0.attn_q_norm.weight": (16,)}), "blk.0.attn_q_norm.weight .*'llama'"),
    ("llama", dict(tensors={"blk.0.ssm_conv1d.weight": (4, 64)}), "blk.0.ssm_conv1d.weight"),
    ("gemma2", dict(tensors={"output.weight": (64, 64)}), "output.weight .*'gemma2'"),
    ("qwen2", dict(meta={"qwen2.attention.key_length": 8, "qwen2.attention.value_length": 8,
                         "qwen2.rope.dimension_count": 8}),
     "key_length=8 .*head_count \\* key_length = embedding_length"),
    ("llama", dict(meta={"llama.rope.dimension_count": 8}), "rope.dimension_count=8 .*partial rotary"),
    ("llama", dict(meta={"llama.rope.scaling.type": "llama3"}), "rope.scaling.type='llama3' .*aborts"),
    ("llama", dict(meta={"llama.attention.head_count_kv": [2, 1]}), "head_count_kv=\\[2, 1\\] .*per-layer"),
    ("llama", dict(meta={"llama.attention.causal": False}), "causal=False .*causal decoder"),
    ("llama", dict(meta={"llama.attention.value_length": 8}), "value_length=8 .*share head_dim"),
    ("llama", dict(meta={"llama.expert_group_count": 2}), "expert_group_count=2"),
    ("llama", dict(meta={"llama.expert_count": 4}), "expert_count=4 .*expert_used_count=0"),
    ("llama", dict(meta={"llama.rope.scaling.attn_factor": 2.0}), "attn_factor=2.0 .*'linear'"),
    ("llama", dict(meta={"llama.rope.scaling.factor": 2.0}, tensors={"rope_freqs.weight": (8,)},
                   rope={"rope_freqs.weight": torch.tensor([1.0, 2, 3, 4, 4, 4, 4, 4])}),
     "rope.scaling.factor=2.0 .*rope_freqs"),
    ("llama", dict(meta={"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0},
                   tensors={"rope_freqs.weight": (8,)}, rope={"rope_freqs.weight": torch.ones(8) * 2}),
     "rope_freqs.weight together with YaRN"),
    ("llama", dict(tensors={"rope_factors_long.weight": (8,)}, rope={"rope_factors_long.weight": torch.ones(8)}),
     "rope.scaling.type='linear' holds rope_factors_long/short"),
    ("granite", dict(drop_meta=("granite.logit_scale",)), "lacks the metadata granite.logit_scale"),
    ("granite", dict(meta={"granite.expert_count": 4, "granite.expert_used_count": 2}), "Granite's mixture"),
    ("gemma2", dict(meta={"gemma2.rope.freq_base_swa": 5000.0, "gemma2.rope.scaling.type": "linear",
                          "gemma2.rope.scaling.factor": 2.0}), "freq_base_swa=5000.0 .*scales both"),
    ("gemma3", dict(meta={"gemma3.rope.scaling.type": "yarn", "gemma3.rope.scaling.factor": 4.0,
                          "gemma3.rope.scaling.attn_factor": 1.5}), "attn_factor=1.5 .*sliding layers"),
    ("qwen2_moe", dict(meta={"qwen2moe.expert_feed_forward_length": [32, 16]}), "per-layer values"),
    ("qwen2_moe", dict(drop=("output.weight",)), "no output.weight; llama.cpp's qwen2moe requires"),
]


@pytest.mark.parametrize("base, changes, message", REFUSED, ids=[m.split(" ")[0][:40] for _, _, m in REFUSED])
def test_files_scratchlm_cannot_compute_are_refused_by_name(files, base, changes, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**fields(files[base], **changes))


def test_unknown_architecture_is_refused(files):
    metadata = {("mamba" + k[5:] if k.startswith("llama.") else k): v for k, v in files["llama"].metadata.items()}
    with pytest.raises(ValueError, match="general.architecture='mamba' is not supported.*llama, qwen2, qwen3, gemma"):
        config_fields({**metadata, "general.architecture": "mamba"}, {}, {})


def test_what_llama_cpp_hard_codes_is_read_its_way(files):
    c = ModelConfig(**fields(files["smollm3"], meta={"smollm3.no_rope_layer_interval": 3}))
    assert c.nope_layers == (3,)  # (il + 1) % 4 == 0, whatever the file says
    assert ModelConfig(**fields(files["qwen2_moe"])).moe_norm_topk_prob is False
    c = ModelConfig(**fields(files["qwen3_moe"], meta={"qwen3moe.expert_weights_norm": False}))
    assert c.moe_norm_topk_prob is True  # the key is not read: always renormalised
    c = ModelConfig(**fields(files["gemma2"], meta={"gemma2.block_count": 46},
                             drop_meta=("gemma2.attention.sliding_window_pattern",)))
    assert c.attn_scale == 1 / math.sqrt(64 // 4) and c.attn_softcap == 50.0 and c.final_softcap == 30.0
    assert ModelConfig(**fields(files["gemma2"])).attn_scale == 1 / math.sqrt(16)
    c = ModelConfig(**fields(files["gemma2"], drop_meta=("gemma2.attention.sliding_window_pattern",)))
    assert c.layer_types == ("sliding_attention", "full_attention") and c.sliding_window == 4096  # defaults
    c = ModelConfig(**fields(files["gemma3"], drop_meta=("gemma3.attention.sliding_window",)))
    assert c.sliding_window is None and c.layer_types is None  # no window key: every layer global
    c = ModelConfig(**fields(files["gemma3"], meta={"gemma3.block_count": 62},
                             drop_meta=("gemma3.attention.sliding_window_pattern",)))
    assert c.attn_scale == 1 / math.sqrt(64 // 4)
    for family in ("llama", "phi3", "qwen2"):  # llama.cpp does not read (phi3: disables) their windows
        c = ModelConfig(**fields(files[family], meta={f"{family}.attention.sliding_window": 4}))
        assert c.sliding_window is None, family
    c = ModelConfig(**fields(files["granite"], meta={"granite.rope.scaling.finetuned": False}))
    assert c.pos_embedding == "none"
    table = torch.tensor([1.0, 1.5, 2.0, 3.0, 3.0, 3.0, 3.0, 3.0])  # no llama3 scaling makes it: kept exactly
    c = ModelConfig(**fields(files["llama"], tensors={"rope_freqs.weight": (8,)}, rope={"rope_freqs.weight": table}))
    assert c.rope_scaling["short_factor"] == c.rope_scaling["long_factor"] == table.tolist()


def test_a_window_llama_cpp_ignores_is_ignored(tmp_path, hf_tokenizer):
    """llama.cpp runs a `llama.attention.sliding_window` file with full attention; so does scratchlm."""
    _, hf = build_family_model("mistral", hf_tokenizer.get_vocab_size())
    meta = {**tokenizer_metadata(hf_tokenizer, "qwen2"), "llama.attention.sliding_window": 4}
    path = write_gguf(hf, tmp_path / "w.gguf", "llama", metadata=meta)
    ids = [(5 * i + 11) % 390 + 5 for i in range(24)]
    llm = llama_cpp.Llama(str(path), n_ctx=256, logits_all=True, verbose=False, n_threads=1, type_k=0, type_v=0)
    try:
        llm.eval(ids)
        theirs = torch.from_numpy(np.array(llm.scores[:len(ids)], dtype=np.float32))
    finally:
        llm.close()
    model = load_gguf(path)
    assert model.config.sliding_window is None
    with torch.no_grad():
        ours, want = model(torch.tensor([ids]))[0], hf(torch.tensor([ids])).logits[0]
    assert (ours - theirs).abs().max() <= 1e-4 * theirs.abs().max()
    assert (ours - want).abs().max() <= 1e-4 * want.abs().max()


EXPORT_REFUSED = [  # (transformers config class, kwargs, what the error names)
    ("Gemma2Config", dict(head_dim=16, query_pre_attn_scalar=32), "gemma2: attn_scale=.*query_pre_attn_scalar is not"),
    ("Gemma2Config", dict(head_dim=16, query_pre_attn_scalar=16, final_logit_softcapping=None),
     "gemma2: attn_softcap=50.0, final_softcap=None .*no 'off'"),
    ("SmolLM3Config", dict(num_hidden_layers=4, no_rope_layer_interval=3), "smollm3: nope_layers=\\(2,\\)"),
    ("Qwen2MoeConfig", dict(MOE, norm_topk_prob=True), "qwen2moe: moe_norm_topk_prob=True .*does not renormalise"),
    ("Qwen3MoeConfig", dict(MOE, norm_topk_prob=False), "qwen3moe: moe_norm_topk_prob=False .*renormalises"),
    ("Qwen3Config", dict(head_dim=16, attention_bias=True), "qwen3: attn_out_bias=True"),
    ("MistralConfig", dict(sliding_window=8), "llama: sliding_window=8"),
    ("LlamaConfig", dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}),
     "llama: rope_scaling type 'dynamic'"),
    ("LlamaConfig", dict(rope_parameters={"rope_type": "yarn", "factor": 2.0, "beta_fast": 16.0, "rope_theta": 1e4}),
     "llama: YaRN \\{'beta_fast': 16.0\\}"),
    ("Qwen2MoeConfig", dict(MOE, num_attention_heads=2, num_key_value_heads=2, head_dim=16),
     "qwen2moe: n_heads \\* head_dim = 32 != d_model=64"),
    ("SmolLM3Config", dict(num_hidden_layers=4, rope_parameters={"rope_type": "llama3", "factor": 8.0,
                                                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                                 "original_max_position_embeddings": 32,
                                                                 "rope_theta": 1e4}),
     "smollm3: rope_scaling type 'llama3'"),
]


@pytest.mark.parametrize("cls, kwargs, message", EXPORT_REFUSED, ids=[m.split(":")[0] + str(i) for i, (_, _, m)
                                                                      in enumerate(EXPORT_REFUSED)])
def test_exports_llama_cpp_would_run_differently_are_refused(tmp_path, cls, kwargs, message):
    model = TransformerLM(scratch_config(cls, **kwargs))
    with pytest.raises(ValueError, match=message):
        save_gguf(model, tmp_path / "x.gguf", type_name="F32")
    assert not list(tmp_path.iterdir())


def test_a_window_that_never_binds_is_no_window(tmp_path):
    """Mistral's window >= the context changes nothing: written as llama (llama.cpp has no window)."""
    model = TransformerLM(scratch_config("MistralConfig", sliding_window=64))
    path = save_gguf(model, tmp_path / "m.gguf", type_name="F32")
    assert read_gguf(path).metadata["general.architecture"] == "llama"
