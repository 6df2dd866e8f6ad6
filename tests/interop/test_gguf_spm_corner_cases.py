"""Hand-built SentencePiece ("llama") GGUF vocabularies for the corner cases of llama.cpp's tokenizer: scratchlm
gives llama.cpp's ids and decoded bytes, its export check names the cases where HF's BPE form cannot, and
what llama.cpp cannot load (or aborts on) is refused by name."""

from __future__ import annotations

import json
import math

import pytest
from tokenizers import Tokenizer as HFTokenizer

from scratchlm.interop.gguf.reader import read_gguf
from scratchlm.interop.gguf.tokenizer_metadata import (pretrained_from_gguf, tokenizer_config_from_gguf,
                                                      tokenizer_json_from_gguf)
from spm_helpers import (BYTE, BYTE_TOKENS, CONTROL, CORPUS, NORMAL, UNKNOWN, UNUSED, USER_DEFINED, LlamaCpp,
                         base_vocab, mismatches, random_texts, write_spm_gguf)

PRINTABLE = [chr(c) for c in range(0x21, 0x7F) if chr(c) not in "~`"]  # "~" and "`" need byte fallback
MERGES = ["▁t", "he", "▁the", "in", "▁a", "er", "on", "▁▁", "re", "▁▁▁▁", "at", "en", "▁w", "or", "it", "is", "an",
          "▁s", "ing", "▁th", "ed", "▁I", "'s", "▁H", "el", "ll", "llo", "▁Hello", "▁wor", "ld", "▁world", "12", "123",
          "▁▁▁", "▁1", "▁<", "</", "s>", "▁[", "IN", "ST", "]▁"]


def vocab(*extra: tuple[str, float, int], chars: list[str] = PRINTABLE, merges: list[str] = MERGES,
          with_bytes: bool = True):
    """<unk> <s> </s>, byte tokens, "▁" and `chars` (score -1000 - i), `merges` (score -1 - i), then `extra`."""
    tokens, scores, types = base_vocab(with_bytes)
    for i, t in enumerate(["▁", *chars]):
        tokens.append(t), scores.append(-1000.0 - i), types.append(NORMAL)
    for i, t in enumerate(merges):
        tokens.append(t), scores.append(-1.0 - i), types.append(NORMAL)
    for t, s, k in extra:
        tokens.append(t), scores.append(s), types.append(k)
    return tokens, scores, types


def load(tmp_path, tokens, scores, types, **kw):
    path = write_spm_gguf(tmp_path / "v.gguf", tokens, scores, types, **kw)
    return path, pretrained_from_gguf(read_gguf(path).metadata).tokenizer


def compare(path, tok, texts):
    ref = LlamaCpp(path)
    try:
        return mismatches(tok, ref, texts)
    finally:
        ref.close()


SPECIAL_TEXTS = random_texts(" ab x<>/s[]INSTtool\n\t▁é中🦙", 120, seed=3)
USER = [("<tool>", 0.0, USER_DEFINED), ("</tool>", 0.0, USER_DEFINED), ("[INST]", 0.0, CONTROL),
        ("[/INST]", 0.0, CONTROL), ("xa", 0.0, USER_DEFINED), ("abc", 0.0, USER_DEFINED), ("INS", 0.0, USER_DEFINED),
        ("▁" * 40 + "long", -0.5, NORMAL)]


def test_specials_user_defined_tokens_and_byte_fallback(tmp_path):
    """Control / unknown tokens only with special=True, user-defined ones always, llama.cpp's longest-first
    partition ("xabc" -> x | abc; "INS" found inside "[INST]" without specials), the "▁" prefix after every
    special token, byte fallback for chars that are not tokens."""
    path, tok = load(tmp_path, *vocab(*USER))
    assert compare(path, tok, CORPUS + SPECIAL_TEXTS) == []
    abc, x = tok.token_to_id("abc"), tok.token_to_id("x")
    assert tok.encode_ordinary("xabc")[-2:] == [x, abc]  # HF's leftmost-longest would cut xa | bc
    encode = tok.hf_form_risks()["encode"]
    assert any(r.startswith("T5") and "overlap" in r for r in encode)
    assert any(r.startswith("T5") and "inside special" in r for r in encode)


@pytest.mark.parametrize("add_space_prefix", [None, True, False])
def test_space_prefix_on_and_off(tmp_path, add_space_prefix):
    path, tok = load(tmp_path, *vocab(*USER), add_space_prefix=add_space_prefix)
    assert compare(path, tok, CORPUS + SPECIAL_TEXTS[:40]) == []


def test_equal_scores_go_to_the_leftmost_pair_and_the_check_says_hf_differs(tmp_path):
    tokens, scores, types = vocab(("bc", -5.0, NORMAL), ("ab", -5.0, NORMAL), chars=list("abcx"), merges=[])
    path, tok = load(tmp_path, tokens, scores, types, add_space_prefix=False)
    ab, bc, a, c = (tok.token_to_id(t) for t in ("ab", "bc", "a", "c"))
    assert tok.encode("abc") == [ab, c]
    assert compare(path, tok, ["abc", "xabcx", "abcabc", "bcab"] + random_texts("abcx ", 40, seed=4)) == []
    assert any(r.startswith("T1") for r in tok.hf_form_risks()["encode"])
    hf = HFTokenizer.from_str(json.dumps(tokenizer_json_from_gguf(read_gguf(path).metadata)))
    assert hf.encode("abc", add_special_tokens=False).ids == [a, bc]  # the disagreement the check names
    with pytest.warns(UserWarning, match="T1: 2 tokens"):
        tok.save_hf_json(tmp_path / "tokenizer.json")


def test_a_char_that_is_not_a_token_still_merges(tmp_path):
    tokens, scores, types = vocab(("▁é", -2.0, NORMAL), chars=list("ab"), merges=[])
    path, tok = load(tmp_path, tokens, scores, types)
    sp, e, a = (tok.token_to_id(t) for t in ("▁", "▁é", "a"))
    assert tok.encode("é a") == [e, sp, a]
    assert compare(path, tok, ["é a", "aé", "éé é", "bé▁é"]) == []
    assert any(r.startswith("T3") for r in tok.hf_form_risks()["encode"])


def test_gemma_style_vocab(tmp_path):
    """No space prefix, BOS 2 / EOS 1, user-defined whitespace runs with real spaces matched before merging,
    control turn tokens, a control "<unused0>" (also unused), an unused [PAD] token rendered as nothing."""
    tokens, scores, types = base_vocab()
    tokens[:3], types[:3] = ["<pad>", "<eos>", "<bos>"], [CONTROL, CONTROL, CONTROL]
    for t, s, k in (("<unk>", 0, UNKNOWN), ("<start_of_turn>", 0, CONTROL), ("<end_of_turn>", 0, CONTROL),
                    ("<unused0>", 0, CONTROL), ("  ", 0, USER_DEFINED), ("   ", 0, USER_DEFINED),
                    ("\n\n", 0, USER_DEFINED), ("▁", -1, NORMAL), ("a", -2, NORMAL), ("b", -3, NORMAL),
                    ("▁a", -4, NORMAL), ("ab", -5, NORMAL), ("[PAD9]", -6, UNUSED), ("▁▁", -7, NORMAL),
                    ("user", -8, NORMAL), ("\n", -9, NORMAL)):
        tokens.append(t), scores.append(float(s)), types.append(k)
    path, tok = load(tmp_path, tokens, scores, types, add_space_prefix=False, add_bos=True, bos=2, eos=1,
                     unk=tokens.index("<unk>"))
    texts = ["a   b", "a  b", " a", "a\n\nb", "<start_of_turn>user\na b<end_of_turn>\n", "<unused0>", "[PAD9]",
             "a<unk>b", "<bos>a", "a     b\n\n\n\nc"]
    assert compare(path, tok, CORPUS + texts) == []
    ids = tok.encode_ordinary("a   b")
    assert [tok.id_to_token(i) for i in ids] == ["a", "   ", "b"]
    pad, unused = tok.token_to_id("[PAD9]"), tok.token_to_id("<unused0>")
    assert tok.decode_bytes([pad]) == b"" and tok.decode_bytes([unused]) == b"<unused0>"


@pytest.mark.parametrize("name", ["Phi3", "phi-3-mini", "Phi 3 Mini"])
def test_phi3_rule_by_general_name(tmp_path, name):
    """"</s>" typed user-defined becomes control (an end-of-generation text); a name with "phi3" / "phi-3"
    rstrips every matched token but <unk> <s> <|endoftext|>; "Phi 3 Mini" does not match the rule."""
    tokens, scores, types = vocab(("<|endoftext|>", 0.0, CONTROL), ("<|assistant|>", 0.0, USER_DEFINED),
                                  ("<|end|>", 0.0, USER_DEFINED), ("<|user|>", 0.0, USER_DEFINED))
    types[2] = USER_DEFINED
    path, tok = load(tmp_path, tokens, scores, types, name=name)
    texts = ["hi</s> there", "</s></s>x", "<|user|>  hi<|end|>\n x", "<|end|>\u00a0x", "<|assistant|>\t\n ok",
             "a <|endoftext|> b", "<s> x", "<unk>  y"]
    assert compare(path, tok, texts + CORPUS[:20]) == []
    assert any(r.startswith("T6") for r in tok.hf_form_risks()["encode"]) is (name != "Phi 3 Mini")


@pytest.mark.parametrize("add_bos,add_eos", [(None, None), (False, None), (True, True), (False, True), (None, True)])
def test_add_bos_and_add_eos_flags(tmp_path, add_bos, add_eos):
    path, tok = load(tmp_path, *vocab(), add_bos=add_bos, add_eos=add_eos)
    assert compare(path, tok, ["Hello world", "", " ", "<s>"]) == []
    config = tokenizer_config_from_gguf(read_gguf(path).metadata)
    assert config["add_bos_token"] is (add_bos is not False) and config["add_eos_token"] is bool(add_eos)


def test_end_of_generation_and_other_text_rules(tmp_path):
    """llama.cpp retypes by text: "<|im_end|>" typed normal and an unset FIM prefix become control,
    "<|channel|>" becomes user-defined, "<|end|>" user-defined next to "<|return|>" and "<|call|>", "</s>"
    normal next to "<|tool_response>", a control "<unused5>" unused too."""
    tokens, scores, types = vocab(("<|im_end|>", 0.0, NORMAL), ("<|fim_prefix|>", 0.0, NORMAL),
                                  ("<|channel|>", 0.0, CONTROL), ("<|return|>", 0.0, CONTROL),
                                  ("<|call|>", 0.0, CONTROL), ("<|end|>", 0.0, CONTROL),
                                  ("<|tool_response>", 0.0, CONTROL), ("<unused5>", 0.0, CONTROL))
    path, tok = load(tmp_path, tokens, scores, types)
    texts = ["a<|im_end|>b", "<|fim_prefix|>x", "<|channel|>final<|message|>", "x<|end|>y<|return|>",
             "<|call|></s>", "</s> <|tool_response>", "<unused5>"]
    assert compare(path, tok, texts) == []
    assert tok.encode_ordinary("<|im_end|>") != [tok.token_to_id("<|im_end|>")]
    assert tok.encode_ordinary("<|end|>") == [tok.token_to_id("<|end|>")]  # user-defined: always matched


def test_decode_matches_llama_detokenize(tmp_path):
    """First-token space strip (not after a hidden BOS), unused tokens as nothing, pieces over 32 bytes, byte
    tokens spelling invalid UTF-8 returned as is."""
    path, tok = load(tmp_path, *vocab(*USER, ("[PAD7]", 0.0, UNUSED)))
    v = tok.token_to_id
    seqs = [[v("▁Hello"), v("▁world")], [1, v("▁Hello")], [2, v("▁Hello")], [v("▁" * 40 + "long"), v("a")],
            [v("<0xE4>"), v("<0xB8>")], [v("<0x20>"), v("a")], [v("[PAD7]"), v("▁a")], [v("<tool>"), v("▁a")],
            [v("▁▁"), 2, v("▁▁▁")], [v("[INST]"), v("▁Hello")], []]
    ref = LlamaCpp(path)
    try:
        for ids in seqs:
            for render in (False, True):
                want = ref.detokenize(ids, render)
                assert tok.decode_bytes(ids, skip_special_tokens=not render) == want, (ids, render)
                assert tok.decode(ids, skip_special_tokens=not render) == want.decode("utf-8", "replace")
    finally:
        ref.close()
    decode = tok.hf_form_risks()["decode"]
    assert any(r.startswith("D:") for r in decode) and any(r.startswith("D1") for r in decode)


def test_what_llama_cpp_cannot_load_or_encode_is_refused_by_name(tmp_path):
    def meta(tokens, scores, types, **kw):
        return read_gguf(write_spm_gguf(tmp_path / "r.gguf", tokens, scores, types, **kw)).metadata

    tokens, scores, types = vocab()
    with pytest.raises(ValueError, match="are both 'a'"):
        pretrained_from_gguf(meta(tokens + ["a"], scores + [0.0], types + [NORMAL]))
    with pytest.raises(ValueError, match="is NaN"):
        pretrained_from_gguf(meta(tokens, [math.nan] + scores[1:], types))
    with pytest.raises(ValueError, match=r"typed byte but are not spelled <0xNN>"):
        pretrained_from_gguf(meta(tokens + ["<0xZZ>"], scores + [0.0], types + [BYTE]))
    with pytest.raises(ValueError, match="Phi-3 rule, which needs the tokens"):
        pretrained_from_gguf(meta(tokens, scores, types, name="Phi3"))
    with pytest.raises(ValueError, match="fim_pre_token_id"):
        pretrained_from_gguf(meta(tokens + ["<PRE>", "<fim_prefix>"], scores + [0.0, 0.0], types + [NORMAL, NORMAL]))
    # without <0xNN> tokens a char that is not a token cannot be encoded (llama.cpp aborts the process)
    no_bytes = vocab(with_bytes=False)
    tok = pretrained_from_gguf(meta(*no_bytes)).tokenizer
    assert tok.encode("hello") == LlamaCpp(tmp_path / "r.gguf").tokenize("hello", False, True)
    with pytest.raises(ValueError, match=r"char 'é' is not in the vocabulary and neither is the byte token <0xC3>"):
        tok.encode("é")
    assert any(r.startswith("T4") for r in tok.hf_form_risks()["encode"])
    assert set(BYTE_TOKENS).isdisjoint(no_bytes[0])
