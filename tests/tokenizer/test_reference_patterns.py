"""The reference split regexes written out in hf_styles.py are the published ones, and scratchlm's
tokenizer/patterns.py holds exactly them.

Provenance, against the installed packages: Llama-3's is transformers' TikTokenConverter default and
Qwen2's transformers' PRETOKENIZE_REGEX (string equality); GPT-2's is compiled into HF tokenizers'
ByteLevel(use_regex=True), so its splits of >= 2000 varied lines must equal a Split on the literal.
"""

from __future__ import annotations

import inspect

from tokenizers import Regex, pre_tokenizers
from transformers.convert_slow_tokenizer import TikTokenConverter
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

from scratchlm.tokenizer import patterns

from . import hf_styles


def test_scratchlm_patterns_are_the_published_literals():
    assert patterns.GPT2_PATTERN == hf_styles.GPT2_PATTERN
    assert patterns.LLAMA3_PATTERN == hf_styles.LLAMA3_PATTERN
    assert patterns.QWEN2_PATTERN == hf_styles.QWEN2_PATTERN


def test_llama3_and_qwen2_literals_are_transformers_own():
    assert hf_styles.LLAMA3_PATTERN == inspect.signature(TikTokenConverter.__init__).parameters["pattern"].default
    assert hf_styles.QWEN2_PATTERN == PRETOKENIZE_REGEX


def test_gpt2_literal_splits_like_hf_byte_level(shared_data):
    builtin = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    literal = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(hf_styles.GPT2_PATTERN), behavior="isolated"),
                                       pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    lines = hf_styles.sample_lines(shared_data)
    for line in lines:
        assert literal.pre_tokenize_str(line) == builtin.pre_tokenize_str(line), line
    assert sum(len(builtin.pre_tokenize_str(line)) > 1 for line in lines) > 1000  # lines really get split
