"""Loading a real model's tokenizer: the entry points other code calls.

    bundle = load_pretrained_tokenizer("path/to/Qwen2.5-0.5B-Instruct")   # an HF model directory
    bundle.tokenizer            Tokenizer (the tokenizer.json pipeline, from scratch)
    bundle.chat_template        ChatTemplate | None (the model's Jinja template)
    bundle.special_tokens       SpecialTokens: bos/eos/pad/unk/... strings and ids, add_bos_token, ...
    ids, mask = bundle.encode_chat(messages, add_generation_prompt=True)

    tok = tokenizer_from_json(tokenizer_json_dict)                        # (b) from memory
    bundle = pretrained_from_json(tokenizer_json_dict, tokenizer_config, chat_template=...)

Files of an HF directory, read as transformers (v5) reads them:
  tokenizer.json            the pipeline (required);
  tokenizer_config.json     named special tokens (bos_token, eos_token, ..., other "*_token" names,
                            extra_special_tokens), chat_template (a string, or [{"name", "template"}]);
  chat_template.jinja       the chat template (wins over tokenizer_config's); additional_chat_templates/
                            NAME.jinja adds named ones;
  special_tokens_map.json   special tokens, used only when tokenizer_config has no added_tokens_decoder.
A named special token that tokenizer.json does not list as an added token is added as a special one
(transformers does the same). add_bos_token / add_eos_token say what the post-processor adds with
add_special_tokens=True (tokenizer.json decides; transformers ignores tokenizer_config's flags then).
A directory with scratchlm's own tokenizer files loads too (scratchlm's ChatML unless a
tokenizer_config.json / chat_template.jinja beside them names a template).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scratchlm.io_utils import read_json_object
from scratchlm.tokenizer import vocab_files
from scratchlm.tokenizer.added_tokens import AddedToken
from scratchlm.tokenizer.chat.render import END_OF_TURN_TOKENS, render_chat
from scratchlm.tokenizer.hf_json import parts_from_dict, read_tokenizer_json
from scratchlm.tokenizer.chat.template import ChatTemplate
from scratchlm.tokenizer.pipeline import TOKENIZER_JSON, Tokenizer

NAMED_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP, CHAT_TEMPLATE_FILE = "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"
ADDED_TOKEN_FLAGS = ("single_word", "lstrip", "rstrip", "normalized", "special")


def _content(value: Any) -> str | None:
    """A special token as configs write it: "<s>", or {"content": "<s>", ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


@dataclass
class SpecialTokens:
    """Named special tokens (bos_token, eos_token, ... and model-specific *_token names) and their ids."""

    named: dict[str, str] = field(default_factory=dict)
    ids: dict[str, int] = field(default_factory=dict)
    extra: list[str] = field(default_factory=list)
    add_bos_token: bool = False
    add_eos_token: bool = False

    def __getattr__(self, name: str) -> Any:
        if name.endswith("_token_id"):
            return self.ids.get(name[: -len("_id")])
        if name.endswith("_token"):
            return self.named.get(name)
        raise AttributeError(name)


@dataclass
class PretrainedTokenizer:
    """A model's tokenizer, chat template and special tokens (module docstring)."""

    tokenizer: Tokenizer
    chat_template: ChatTemplate | None
    special_tokens: SpecialTokens
    tokenizer_config: dict = field(default_factory=dict)

    @property
    def stop_token_ids(self) -> list[int]:
        """Ids that end a reply: the eos token and the end-of-turn tokens the vocab has."""
        ids = [self.special_tokens.eos_token_id] if self.special_tokens.eos_token_id is not None else []
        ids += [i for s, i in self.tokenizer.special_token_ids.items() if s in END_OF_TURN_TOKENS]
        return list(dict.fromkeys(ids))

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = False,
                    **kwargs: Any) -> tuple[list[int], list[int]]:
        """(ids, assistant mask): the model's chat template, or scratchlm's ChatML when it has none."""
        return render_chat(self.tokenizer, messages, add_generation_prompt, **kwargs)


def _named_tokens(config: dict, special_map: dict | None) -> tuple[dict[str, Any], list[Any]]:
    """(name -> token as written, extra tokens) from tokenizer_config (+ special_tokens_map.json)."""
    named = {k: v for k, v in config.items() if (k in NAMED_TOKENS or k.endswith("_token")) and _content(v)}
    extra = config.get("extra_special_tokens", config.get("additional_special_tokens")) or []
    if isinstance(extra, dict):
        named.update({k: v for k, v in extra.items() if _content(v)})
        extra = []
    if special_map and "added_tokens_decoder" not in config:
        for k, v in special_map.items():
            if k in ("additional_special_tokens", "extra_special_tokens") and isinstance(v, list):
                extra = list(extra) + [t for t in v if t not in extra]
            elif _content(v):
                named[k] = v
    return named, list(extra)


def _add_missing(parts: Any, tokens: list[Any]) -> None:
    """Add named special tokens that tokenizer.json lacks as special added tokens (as transformers)."""
    have = {t.content for t in parts.added_tokens}
    next_id = max([*parts.model.vocab.values(), *(t.id for t in parts.added_tokens)], default=-1) + 1
    for raw in tokens:
        content = _content(raw)
        if content is None or content in have:
            continue
        flags = {k: bool(raw[k]) for k in ADDED_TOKEN_FLAGS if isinstance(raw, dict) and k in raw}
        flags["special"] = True
        flags.setdefault("normalized", False)
        tid = parts.model.vocab.get(content)
        if tid is None:
            tid, next_id = next_id, next_id + 1
        parts.added_tokens.append(AddedToken(content, tid, **flags))
        have.add(content)


def _template_source(config: dict, chat_template: Any) -> str | dict[str, str] | None:
    src = chat_template if chat_template is not None else config.get("chat_template")
    if isinstance(src, list):  # [{"name": ..., "template": ...}, ...]
        src = {t["name"]: t["template"] for t in src if isinstance(t, dict) and "name" in t and "template" in t}
    return src or None


def pretrained_from_json(tokenizer_json: dict, tokenizer_config: dict | None = None, *,
                         chat_template: str | dict[str, str] | None = None, special_tokens_map: dict | None = None,
                         impl: str = "reference") -> PretrainedTokenizer:
    """The bundle from in-memory files (tokenizer.json dict, tokenizer_config dict, template source)."""
    return pretrained_from_parts(parts_from_dict(tokenizer_json), tokenizer_config, chat_template=chat_template,
                                 special_tokens_map=special_tokens_map, impl=impl)


def pretrained_from_parts(parts: Any, tokenizer_config: dict | None = None, *,
                          chat_template: str | dict[str, str] | None = None, special_tokens_map: dict | None = None,
                          impl: str = "reference", add_named_tokens: bool = True) -> PretrainedTokenizer:
    """The bundle from a tokenizer's parts (hf_json.TokenizerParts) and its config. add_named_tokens=False keeps
    named special tokens the parts do not list as added tokens out of the matching (GGUF vocabularies: llama.cpp
    matches only the tokens typed control / user-defined / unknown)."""
    config = dict(tokenizer_config or {})
    named, extra = _named_tokens(config, special_tokens_map)
    if add_named_tokens:
        _add_missing(parts, [*named.values(), *extra])
    tok = Tokenizer.from_parts(parts, impl=impl)
    names = {k: _content(v) for k, v in named.items()}
    ids = {k: tok.token_to_id(v) for k, v in names.items() if tok.token_to_id(v) is not None}
    with_specials = tok.encode("", add_special_tokens=True)
    specials = SpecialTokens(names, ids, [_content(t) for t in extra if _content(t)],
                             add_bos_token=bool(with_specials) and with_specials[0] == ids.get("bos_token"),
                             add_eos_token=bool(with_specials) and with_specials[-1] == ids.get("eos_token"))
    source = _template_source(config, chat_template)
    template = ChatTemplate(source, names) if source else None
    tok.chat_template, tok.special_tokens_map = template, names
    return PretrainedTokenizer(tok, template, specials, config)


def _read_json(path: Path) -> dict | None:
    """The JSON object in `path`, or None when the file is absent (a corrupt file is a ValueError)."""
    return read_json_object(path, str(path)) if path.is_file() else None


def _read_templates(d: Path) -> str | dict[str, str] | None:
    """chat_template.jinja (+ additional_chat_templates/NAME.jinja), or None."""
    templates = {}
    if (d / CHAT_TEMPLATE_FILE).is_file():
        templates["default"] = (d / CHAT_TEMPLATE_FILE).read_text(encoding="utf-8")
    extra_dir = d / "additional_chat_templates"
    if extra_dir.is_dir():
        templates.update({p.stem: p.read_text(encoding="utf-8") for p in sorted(extra_dir.glob("*.jinja"))})
    if list(templates) == ["default"]:
        return templates["default"]
    return templates or None


def load_pretrained_tokenizer(directory: str | Path, *, impl: str = "reference",
                              prefer_hf: bool = True) -> PretrainedTokenizer:
    """(a): the tokenizer, chat template and special tokens of a model directory (module docstring).
    With both tokenizer.json and scratchlm's files present, prefer_hf picks tokenizer.json."""
    d = Path(directory)
    if not d.is_dir():
        raise FileNotFoundError(f"model directory {d} does not exist")
    has_hf, has_ours = (d / TOKENIZER_JSON).is_file(), (d / vocab_files.META_FILE).is_file()
    if not has_hf and not has_ours:
        raise FileNotFoundError(f"{d} has no tokenizer: neither tokenizer.json (HF) nor {vocab_files.META_FILE} (scratchlm)")
    config = _read_json(d / TOKENIZER_CONFIG) or {}
    if has_ours and not (has_hf and prefer_hf):
        tok = Tokenizer.load(d, impl=impl)
        names = {k: _content(v) for k, v in _named_tokens(config, None)[0].items()}
        source = _template_source(config, _read_templates(d))
        tok.chat_template = ChatTemplate(source, names) if source else None
        tok.special_tokens_map = names
        ids = {k: tok.token_to_id(v) for k, v in names.items() if tok.token_to_id(v) is not None}
        return PretrainedTokenizer(tok, tok.chat_template, SpecialTokens(names, ids), config)
    return pretrained_from_json(read_tokenizer_json(d / TOKENIZER_JSON), config, chat_template=_read_templates(d),
                                special_tokens_map=_read_json(d / SPECIAL_TOKENS_MAP), impl=impl)


def tokenizer_from_json(tokenizer_json: dict, *, impl: str = "reference") -> Tokenizer:
    """(b): a Tokenizer from a tokenizer.json-shaped dict (e.g. converted from GGUF metadata)."""
    return Tokenizer.from_hf_dict(tokenizer_json, impl=impl)


def load_hf_tokenizer_json(path: str | Path, *, impl: str = "reference") -> Tokenizer:
    """A Tokenizer from a tokenizer.json file."""
    return Tokenizer.from_hf_json(path, impl=impl)


def save_hf_tokenizer_json(tok: Tokenizer, path: str | Path) -> None:
    """Write `tok` as an HF tokenizer.json at `path` (atomic)."""
    tok.save_hf_json(path)


def load_gpt2_files(vocab_json: str | Path, merges_txt: str | Path, *, impl: str = "reference") -> Tokenizer:
    """GPT-2's original encoder.json + vocab.bpe as a Tokenizer."""
    return Tokenizer(*vocab_files.read_gpt2_files(vocab_json, merges_txt), impl=impl)
