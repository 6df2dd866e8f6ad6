"""BPE tokenizers as HF tokenizer.json pipelines, from scratch: training (`train_bpe`), the pipeline
(`Tokenizer`), loading real models' tokenizers (`load_pretrained_tokenizer`, `tokenizer_from_json`),
their chat templates (`ChatTemplate`) and scratchlm's own ChatML (`render_chat`)."""

from scratchlm.tokenizer.bpe_train import train_bpe
from scratchlm.tokenizer.chat_template import DEFAULT_SPECIAL_TOKENS, render_chat
from scratchlm.tokenizer.pipeline import Tokenizer

__all__ = ["Tokenizer", "train_bpe", "render_chat", "DEFAULT_SPECIAL_TOKENS"]
