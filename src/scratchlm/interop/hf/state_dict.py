"""State-dict mapping between scratchlm and the HF layouts of the Llama, Qwen2/3 and GPT-2 families.

Llama/Qwen: our parameter names ARE the HF names [firm], so the map is the identity plus
  * a tied head stored once (HF drops `lm_head.weight` when `tie_word_embeddings`),
  * zero biases where the HF family has a bias our config lacks (exact: adding 0 changes nothing),
  * RoPE pairing: HF rotates "half"-style. For an "interleaved" model the head dims of q/k (rows of
    q_proj/k_proj, their biases, and q_norm/k_norm weights) are permuted per head with
    perm = interleaved_to_half_permutation(Hd), W_half[h, j] = W_inter[h, perm[j]]; q.k is unchanged
    because the same permutation hits both.
GPT-2 (Conv1D stores W as (in, out), i.e. transposed; c_attn fuses q/k/v along the output dim):
    transformer.wte / wpe / ln_f             <-> model.embed_tokens / embed_positions / norm
    h.{i}.ln_1 / ln_2                        <-> layers.{i}.input_layernorm / post_attention_layernorm
    h.{i}.attn.c_attn.weight (D, 3D)         <-> cat(q_proj, k_proj, v_proj).weight.T
    h.{i}.attn.c_proj / mlp.c_fc / mlp.c_proj <-> self_attn.o_proj / mlp.up_proj / mlp.down_proj (.T)
"""

from __future__ import annotations

import torch

from scratchlm.config import ModelConfig
from scratchlm.interop.hf.config_json import hf_attention_bias
from scratchlm.interop.hf.families import FAMILIES
from scratchlm.nn.rope import interleaved_to_half_permutation

Tensor = torch.Tensor
StateDict = dict[str, Tensor]
# HF keys that are buffers or caches in some checkpoints, never weights.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias")
GPT2_GLOBAL = (("model.embed_tokens", "transformer.wte"), ("model.embed_positions", "transformer.wpe"),
               ("model.norm", "transformer.ln_f"))
# (ours under model.layers.{i}., HF under transformer.h.{i}., Conv1D-transposed)
GPT2_LAYER = (("input_layernorm", "ln_1", False), ("post_attention_layernorm", "ln_2", False),
              ("self_attn.o_proj", "attn.c_proj", True), ("mlp.up_proj", "mlp.c_fc", True),
              ("mlp.down_proj", "mlp.c_proj", True))
QKV = ("q_proj", "k_proj", "v_proj")


def permute_rope_heads(state: StateDict, config: ModelConfig, to_half: bool) -> StateDict:
    """Permute q/k head dims between "interleaved" and "half" pairing (see module docstring)."""
    perm = interleaved_to_half_permutation(config.head_dim, config.rope_dim)
    if not to_half:
        perm = torch.argsort(perm)
    heads = {"q_proj": config.n_heads, "k_proj": config.n_kv_heads}
    out = dict(state)
    for name, t in state.items():
        module = name.rsplit(".", 2)[-2] if name.count(".") >= 2 else ""
        if module in heads and ".self_attn." in name:
            rows = t.reshape(heads[module], config.head_dim, *t.shape[1:])  # (H, Hd[, D])
            out[name] = rows[:, perm].reshape(t.shape)
        elif module in ("q_norm", "k_norm") and ".self_attn." in name:  # (Hd,) per head, or (heads * Hd,)
            n = heads["q_proj" if module == "q_norm" else "k_proj"] if t.numel() != config.head_dim else 1
            out[name] = t.reshape(n, config.head_dim)[:, perm].reshape(t.shape)
    return out


def _fill_zero_biases(state: StateDict, config: ModelConfig, family: str) -> None:
    """Add zero biases that the HF family has and our model lacks (in place)."""
    wanted: list[str] = []
    if hf_attention_bias(config, family):
        wanted += [f"self_attn.{p}" for p in QKV] + (["self_attn.o_proj"] if FAMILIES[family].o_bias else [])
    if family == "gpt2":
        wanted += ["mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm"]
    prefixes = [f"model.layers.{i}.{m}" for i in range(config.n_layers) for m in wanted]
    if family == "gpt2":
        prefixes.append("model.norm")
    for prefix in prefixes:
        weight = state[f"{prefix}.weight"]
        state.setdefault(f"{prefix}.bias", weight.new_zeros(weight.shape[0]))


def _move_globals(state: StateDict, to_hf: bool) -> StateDict:
    """Pop the GPT2_GLOBAL tensors (weight and bias) from `state`, renamed to the other side."""
    out: StateDict = {}
    for ours, hf in GPT2_GLOBAL:
        src, dst = (ours, hf) if to_hf else (hf, ours)
        for kind in ("weight", "bias"):
            if f"{src}.{kind}" in state:
                out[f"{dst}.{kind}"] = state.pop(f"{src}.{kind}")
    return out


def _gpt2_map(state: StateDict, config: ModelConfig, to_hf: bool) -> StateDict:
    """Our layout <-> GPT-2's (module docstring), the same tables read in either direction; pops what it
    maps and passes the rest through (lm_head.weight when untied; anything unexpected, which the strict
    load reports)."""
    out = _move_globals(state, to_hf)
    for i in range(config.n_layers):
        ours_at, hf_at = f"model.layers.{i}.", f"transformer.h.{i}."
        for ours, hf, transposed in GPT2_LAYER:
            src, dst = (ours_at + ours, hf_at + hf) if to_hf else (hf_at + hf, ours_at + ours)
            for kind in ("weight", "bias"):
                t = _pop(state, f"{src}.{kind}")
                out[f"{dst}.{kind}"] = t.t().contiguous() if transposed and kind == "weight" else t
        qkv = [f"{ours_at}self_attn.{p}" for p in QKV]
        if to_hf:  # c_attn is the Conv1D form (D, 3D) of rows q | k | v
            out[f"{hf_at}attn.c_attn.weight"] = torch.cat([_pop(state, f"{k}.weight") for k in qkv], 0).t().contiguous()
            out[f"{hf_at}attn.c_attn.bias"] = torch.cat([_pop(state, f"{k}.bias") for k in qkv], 0)
        else:
            w = _pop(state, f"{hf_at}attn.c_attn.weight").t()  # (3D, D): rows q | k | v
            b = _pop(state, f"{hf_at}attn.c_attn.bias")
            for k, wp, bp in zip(qkv, w.chunk(3, 0), b.chunk(3, 0)):
                out[f"{k}.weight"], out[f"{k}.bias"] = wp.contiguous(), bp.contiguous()
    out.update(state)
    return out


HEAD_KEY = "lm_head.weight"
EMBED_KEYS = ("model.embed_tokens.weight", "embed_tokens.weight", "transformer.wte.weight", "wte.weight")


def stored_head_differs(hf_state: StateDict) -> bool:
    """True when the checkpoint stores an lm_head.weight that is not a copy of the token embedding.

    transformers then does NOT tie the head even with tie_word_embeddings=true (it warns and keeps both)."""
    head = hf_state.get(HEAD_KEY)
    embed = next((hf_state[k] for k in EMBED_KEYS if k in hf_state), None)
    return head is not None and embed is not None and not torch.equal(head, embed)


def _fused_sizes(config: ModelConfig) -> dict[str, int]:
    """Rows of each of our modules inside a fused HF matrix (q: H*Hd, k/v: KvH*Hd, gate/up: d_ff)."""
    q, kv = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
    return {"self_attn.q_proj": q, "self_attn.k_proj": kv, "self_attn.v_proj": kv, "mlp.gate_proj": config.d_ff,
            "mlp.up_proj": config.d_ff}


def split_fused(state: StateDict, config: ModelConfig, fused: dict[str, tuple[str, ...]]) -> StateDict:
    """Phi-3's qkv_proj / gate_up_proj (rows q | k | v, gate | up) -> our separate modules."""
    sizes = _fused_sizes(config)
    for i in range(config.n_layers):
        for hf, parts in fused.items():
            for kind in ("weight", "bias"):
                key = f"model.layers.{i}.{hf}.{kind}"
                if kind == "weight" or key in state:
                    chunks = _split_rows(_pop(state, key), key, [sizes[p] for p in parts], config)
                    state.update({f"model.layers.{i}.{p}.{kind}": c.contiguous() for p, c in zip(parts, chunks)})
    return state


def _split_rows(t: Tensor, key: str, sizes: list[int], config: ModelConfig) -> tuple[Tensor, ...]:
    """t split by rows into `sizes`, or a ValueError when the config's sizes do not add up to t's rows."""
    if t.shape[0] != sum(sizes):
        raise ValueError(f"HF checkpoint tensor {key!r} has {t.shape[0]} rows but config.json implies "
                         f"{' + '.join(map(str, sizes))} = {sum(sizes)} (num_attention_heads={config.n_heads}, "
                         f"num_key_value_heads={config.n_kv_heads}, head_dim={config.head_dim}, "
                         f"intermediate_size={config.d_ff}); the config does not describe these weights")
    return t.split(sizes, 0)


def fuse(state: StateDict, config: ModelConfig, fused: dict[str, tuple[str, ...]]) -> StateDict:
    """Our separate q/k/v and gate/up matrices -> Phi-3's fused qkv_proj / gate_up_proj."""
    for i in range(config.n_layers):
        for hf, parts in fused.items():
            for kind in ("weight", "bias"):
                keys = [f"model.layers.{i}.{p}.{kind}" for p in parts]
                if keys[0] in state:
                    state[f"model.layers.{i}.{hf}.{kind}"] = torch.cat([state.pop(k) for k in keys], 0)
    return state


def stack_experts(state: StateDict, config: ModelConfig, names: dict[str, str]) -> StateDict:
    """Per-expert HF matrices mlp.experts.{e}.{hf}.weight -> our stacked mlp.experts.{ours} (E, out, in);
    transformers v5's own in-memory layout (gate_up_proj (E, 2F, D), down_proj) is accepted too."""
    for i in (i for i in range(config.n_layers) if config.is_moe_layer(i)):
        prefix = f"model.layers.{i}.mlp.experts."
        if prefix + "gate_up_proj" in state:
            state[prefix + "gate_proj"], state[prefix + "up_proj"] = state.pop(prefix + "gate_up_proj").chunk(2, 1)
            continue
        for ours, hf in names.items():
            state[prefix + ours] = torch.stack([_pop(state, f"{prefix}{e}.{hf}.weight")
                                                for e in range(config.moe_num_experts)])
    return state


def unstack_experts(state: StateDict, config: ModelConfig, names: dict[str, str]) -> StateDict:
    """Our stacked expert matrices -> the Hub's per-expert layout (what transformers' save_pretrained writes)."""
    for i in (i for i in range(config.n_layers) if config.is_moe_layer(i)):
        prefix = f"model.layers.{i}.mlp.experts."
        for ours, hf in names.items():
            for e, matrix in enumerate(state.pop(prefix + ours).unbind(0)):
                state[f"{prefix}{e}.{hf}.weight"] = matrix.contiguous()
    return state


def rename_layer_modules(state: StateDict, mapping: dict[str, str]) -> StateDict:
    """Rename the per-layer modules `model.layers.{i}.{old}.*` -> `{new}` for every old -> new in mapping,
    all at once (so swaps such as Gemma-2's post_attention_layernorm <-> ours are safe)."""
    if not mapping:
        return state
    out: StateDict = {}
    for key, value in state.items():
        head, sep, rest = key.partition(".layers.")
        if sep:
            index, _, sub = rest.partition(".")
            module, dot, tail = sub.partition(".")
            key = f"{head}.layers.{index}.{mapping.get(module, module)}{dot}{tail}"
        out[key] = value
    return out


def _pop(state: StateDict, key: str) -> Tensor:
    if key not in state:
        raise ValueError(f"HF checkpoint is missing tensor {key!r}; does config.json match the checkpoint "
                         "(num_hidden_layers, the number of experts)?")
    return state.pop(key)


def _add_prefix(state: StateDict, prefix: str) -> StateDict:
    """Base-model checkpoints (LlamaModel, GPT2Model) lack the `model.` / `transformer.` prefix."""
    if any(k.startswith(prefix) for k in state):
        return state
    return {k if k == "lm_head.weight" else prefix + k: v for k, v in state.items()}


def state_to_hf(model_state: StateDict, config: ModelConfig, family: str) -> StateDict:
    """Our state_dict -> HF tensors (CPU, contiguous) for `family`."""
    state = {k: v.detach().to("cpu") for k, v in model_state.items()}
    if config.tie_embeddings:
        state.pop("lm_head.weight", None)
    if config.pos_embedding == "rope" and config.rope_style == "interleaved":
        state = permute_rope_heads(state, config, to_half=True)
    _fill_zero_biases(state, config, family)
    state = unstack_experts(state, config, FAMILIES[family].experts)
    state = rename_layer_modules(state, {ours: hf for hf, ours in FAMILIES[family].renames.items()})
    state = fuse(state, config, FAMILIES[family].fused)
    if family == "gpt2":
        state = _gpt2_map(state, config, to_hf=True)
    return {k: v.contiguous() for k, v in state.items()}


def state_from_hf(hf_state: StateDict, config: ModelConfig, family: str) -> StateDict:
    """HF tensors -> our state_dict names and layout (the caller loads it strictly)."""
    state = {k: v for k, v in hf_state.items() if not k.endswith(IGNORED_SUFFIXES)}
    if family == "gpt2":
        state = _gpt2_map(_add_prefix(state, "transformer."), config, to_hf=False)
    else:
        state = rename_layer_modules(_add_prefix(state, "model."), FAMILIES[family].renames)
        state = split_fused(state, config, FAMILIES[family].fused)
        state = stack_experts(state, config, FAMILIES[family].experts)
    if config.tie_embeddings:
        state.pop("lm_head.weight", None)
        state["lm_head.weight"] = state.get("model.embed_tokens.weight")
    elif "lm_head.weight" not in state:
        raise ValueError("HF checkpoint has tie_word_embeddings=false but no lm_head.weight tensor; "
                         "set tie_word_embeddings=true in config.json if the head is tied")
    if config.pos_embedding == "rope" and config.rope_style == "interleaved":
        state = permute_rope_heads(state, config, to_half=False)
    return state
