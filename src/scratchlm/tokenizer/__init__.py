"""BPE tokenizers as HF tokenizer.json pipelines, from scratch: training (`train_bpe`), the pipeline
(`Tokenizer`), loading real models' tokenizers (`load_pretrained_tokenizer` for a model directory,
`tokenizer_from_json` / `pretrained_from_json` for a tokenizer.json-shaped dict), their chat templates
(`ChatTemplate`) and scratchlm's own ChatML (`render_chat`). GGUF SentencePiece vocabularies run through the
same pipeline with llama.cpp's stages (sentencepiece_bpe.py, added_tokens.LongestFirstVocabulary,
token_pieces.py; built by interop/gguf/tokenizer_metadata.py)."""

from scratchlm.tokenizer.training.bpe_trainer import train_bpe
from scratchlm.tokenizer.chat.render import DEFAULT_SPECIAL_TOKENS, chat_prompt_ids, render_chat
from scratchlm.tokenizer.chat.template import ChatTemplate
from scratchlm.tokenizer.pipeline import Tokenizer
from scratchlm.tokenizer.hf_files import (PretrainedTokenizer, SpecialTokens, load_pretrained_tokenizer,
                                            pretrained_from_json, tokenizer_from_json)

__all__ = ["Tokenizer", "train_bpe", "render_chat", "chat_prompt_ids", "DEFAULT_SPECIAL_TOKENS", "ChatTemplate",
           "PretrainedTokenizer", "SpecialTokens", "load_pretrained_tokenizer", "pretrained_from_json",
           "tokenizer_from_json"]
