"""Token attributes as llama.cpp derives them for a GGUF vocabulary (`llama_vocab::impl::load`).

A GGUF gives each token a type (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte; anything
else is "undefined"); llama.cpp turns it into attribute bits (include/llama.h) and then rewrites some of
them by token text:
  1. an end-of-turn / end-of-message / fill-in-the-middle id the file does not set is found by its usual
     texts ("<|eot_id|>", "<|fim_prefix|>", ...) and that token becomes control;
  2. control tokens whose text contains "unused" are unused too;
  3. every token with an end-of-generation text ("</s>", "<end_of_turn>", "<|end|>", ...) becomes control;
  4. gpt-oss's "<|channel|>", "<|message|>", "<|start|>", "<|constrain|>" become exactly user-defined;
  5. "<|end|>" becomes user-defined when "<|return|>" and "<|call|>" (or "<|calls|>" and "<|flush|>") end
     generation too; "</s>" becomes normal next to "<|tool_response>" or "<|plamo:eos|>";
  6. by name: Phi-3 ("phi-3" / "phi3" in general.name) rstrips every matched token but "<unk>", "<s>",
     "<|endoftext|>"; jina-v2 / nomic-bert-moe / jina-bert-v3 lstrip "<mask>", modern-bert "[MASK]".
What the attributes decide: tokens with control, user-defined or unknown bits are cut out of the text before
the model runs (user-defined always, the others only when special tokens are parsed), and each token's
piece when decoding (`piece`).
"""

from __future__ import annotations

from scratchlm.tokenizer.byte_fallback import parse_byte_token

A_UNKNOWN, A_UNUSED, A_NORMAL, A_CONTROL, A_USER_DEFINED, A_BYTE = 1, 2, 4, 8, 16, 32
TYPE_ATTR = {1: A_NORMAL, 2: A_UNKNOWN, 3: A_CONTROL, 4: A_USER_DEFINED, 5: A_UNUSED, 6: A_BYTE}
MATCHED = A_CONTROL | A_USER_DEFINED | A_UNKNOWN  # cut out of the text before the model runs
HIDDEN = A_CONTROL | A_UNKNOWN  # matched and rendered only with special tokens

# ids llama.cpp looks up by text when the file lacks them (GGUF key -> texts), in its order
AUTO_IDS = {
    "eot_token_id": ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
                     "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>"),
    "eom_token_id": ("<|eom_id|>",),
    "fim_pre_token_id": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                         "<|code_prefix|>", "<|prefix|>"),
    "fim_suf_token_id": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                         "<|code_suffix|>", "<|suffix|>"),
    "fim_mid_token_id": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                         "<|code_middle|>", "<|middle|>"),
    "fim_pad_token_id": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep_token_id": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep_token_id": ("<|file_sep|>",),
}
# the older names of the FIM keys, read into the same ids
FIM_ALIASES = {"prefix_token_id": "fim_pre_token_id", "suffix_token_id": "fim_suf_token_id",
               "middle_token_id": "fim_mid_token_id"}
EOG_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~["))
ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")
PHI3_UNSTRIPPED = ("<unk>", "<s>", "<|endoftext|>")


def _auto_ids(tokens: list[str], attrs: list[int], ids: dict[str, int | None]) -> None:
    """Rule 1 (module docstring): fill the missing ids from their texts, making that token control."""
    by_text = {t: i for i, t in enumerate(tokens)}
    for key, texts in AUTO_IDS.items():
        if ids.get(key) is not None:
            continue
        found = [by_text[t] for t in texts if t in by_text]
        if len(found) > 1 and any(not attrs[i] & A_CONTROL and tokens[i] not in EOG_TEXTS for i in found):
            raise ValueError(f"tokens {[tokens[i] for i in found]} all look like the {key} the file does not set; "
                             "llama.cpp makes the first one its hash table yields a control token, so which "
                             "tokenizer it runs is unspecified: set tokenizer.ggml." + key)
        if found:
            ids[key] = found[0]
            attrs[found[0]] |= A_CONTROL


def _eog_rules(tokens: list[str], attrs: list[int], ids: dict[str, int | None]) -> set[int]:
    """Rules 3-5 (module docstring) on the end-of-generation set llama.cpp keeps; returns that set."""
    eog = {ids[k] for k in ("fim_pad_token_id", "fim_rep_token_id", "fim_sep_token_id") if ids.get(k) is not None}
    for i, t in enumerate(tokens):
        if t in EOG_TEXTS:
            eog.add(i)
            attrs[i] |= A_CONTROL
        if t in ALWAYS_RENDERED:
            attrs[i] = A_USER_DEFINED
    eog |= {ids[k] for k in ("eos_token_id", "eot_token_id", "eom_token_id") if ids.get(k) is not None}
    texts = {tokens[i]: i for i in eog}
    call = "<|call|>" in texts or "<|calls|>" in texts
    if "<|end|>" in texts and call and ("<|return|>" in texts or "<|flush|>" in texts):
        attrs[texts["<|end|>"]] = A_USER_DEFINED
        eog.discard(texts["<|end|>"])  # gpt-oss: <|end|> ends a message, not the generation
    if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
        attrs[texts["</s>"]] = A_NORMAL
        eog.discard(texts["</s>"])
    return eog


def eog_ids(tokens: list[str], types: list[int], ids: dict[str, int | None]) -> set[int]:
    """The ids that end a generation in llama.cpp (`llama_vocab_is_eog`): eos / eot / eom, the FIM pad /
    repo / separator tokens, and every token whose text is an end-of-generation text (EOG_TEXTS), after
    the rules of `token_attributes`."""
    attrs = [TYPE_ATTR.get(t, 0) for t in types]
    _auto_ids(tokens, attrs, ids)
    return _eog_rules(tokens, attrs, ids)


def token_attributes(tokens: list[str], types: list[int], ids: dict[str, int | None]) -> list[int]:
    """Each token's attribute bits after llama.cpp's rules 1-5 (module docstring). `ids`: GGUF id key ->
    id or None (missing ones found by text are filled in)."""
    attrs = [TYPE_ATTR.get(t, 0) for t in types]
    _auto_ids(tokens, attrs, ids)
    for i, t in enumerate(tokens):
        if attrs[i] & A_CONTROL and "unused" in t:
            attrs[i] |= A_UNUSED
    _eog_rules(tokens, attrs, ids)
    return attrs


def strip_ids(tokens: list[str], attrs: list[int], name: str, pre: str, arch: str) -> tuple[set[int], set[int]]:
    """(lstrip ids, rstrip ids) by llama.cpp's rule 6 from general.name, tokenizer.ggml.pre and
    general.architecture."""
    by_text = {t: i for i, t in enumerate(tokens)}
    name = "".join(c.lower() if c.isascii() else c for c in name)  # C tolower: ASCII only
    if any(x in pre for x in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
            x in arch for x in ("nomic-bert-moe", "jina-bert-v3")):
        return ({by_text["<mask>"]} if "<mask>" in by_text else set()), set()
    if "phi-3" in name or "phi3" in name:
        missing = [t for t in ("</s>", *PHI3_UNSTRIPPED) if t not in by_text]
        if missing:
            raise ValueError(f"general.name {name!r} selects llama.cpp's Phi-3 rule, which needs the tokens {missing}; "
                             "llama.cpp cannot load this vocabulary")
        rstrip = {i for i, a in enumerate(attrs) if a & MATCHED} | {by_text["</s>"]}
        return set(), rstrip - {by_text[t] for t in PHI3_UNSTRIPPED}
    if "modern-bert" in name and "[MASK]" in by_text:
        return {by_text["[MASK]"]}, set()
    return set(), set()


def piece(text: str, attr: int) -> bytes:
    """A token's bytes when decoding with special tokens rendered (llama_token_to_piece, SentencePiece):
    control / unknown / user-defined -> the text; normal -> "▁" as " "; byte -> the byte; else nothing."""
    if attr & MATCHED:
        return text.encode("utf-8")
    if attr & A_NORMAL:
        return text.replace("▁", " ").encode("utf-8")
    if attr & A_BYTE:
        return bytes([parse_byte_token(text)])
    return b""
