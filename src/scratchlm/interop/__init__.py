"""Hugging Face interop: load and save Llama, Qwen2/Qwen3 and GPT-2 checkpoints and tokenizer.json.

    model = scratchlm.from_pretrained("path/to/hf_dir")      # HF (or scratchlm) directory -> TransformerLM
    scratchlm.save_pretrained(model, "out_dir", max_shard_size="2GB")   # -> transformers-loadable dir
"""

from scratchlm.interop.pretrained import from_pretrained, save_pretrained
from scratchlm.interop.tokenizer_files import load_hf_tokenizer, save_hf_tokenizer

__all__ = ["from_pretrained", "save_pretrained", "load_hf_tokenizer", "save_hf_tokenizer"]
