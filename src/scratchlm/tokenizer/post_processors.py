"""Post-processors: the last encoding stage, adding special tokens around the encoded text(s).

Only `encode(..., add_special_tokens=True)` adds tokens; chat templates encode with False (the
template writes its own BOS), as transformers' apply_chat_template does.
    TemplateProcessing   a template per case: Llama-3 "<|begin_of_text|> $A", pair "$A $B:1", any
                         special token a list of ids; type ids as the template says
    BertProcessing       [CLS] A [SEP]  /  [CLS] A [SEP] B [SEP]   (type ids 0, then 1)
    RobertaProcessing    <s> A </s>  /  <s> A </s></s> B </s>      (type ids all 0; trims offsets)
    ByteLevel            offsets only (byte_level.py)
    Sequence([...])      applied in order
"""

from __future__ import annotations

from scratchlm.tokenizer.byte_level import ByteLevel, trim_offsets
from scratchlm.tokenizer.encoding import Encoding
from scratchlm.tokenizer.json_fields import check_fields, dispatch


def _special(ids: list[int], tokens: list[str], type_id: int, tracked: bool) -> Encoding:
    """An encoding of tokens a post-processor adds: offsets (0, 0)."""
    if not tracked:
        return Encoding(list(ids))
    return Encoding(list(ids), [(0, 0)] * len(ids), list(tokens), [type_id] * len(ids))


class TemplateProcessing:
    """Templates of pieces {"SpecialToken": {"id", "type_id"}} / {"Sequence": {"id": "A"|"B", "type_id"}}."""

    def __init__(self, single: list[dict], pair: list[dict], special_tokens: dict[str, dict]) -> None:
        self.single, self.pair, self.special_tokens = single, pair, special_tokens
        for name, tmpl in (("single", single), ("pair", pair)):
            for piece in tmpl:
                kind, body = self._piece(piece, name)
                if kind == "SpecialToken" and body["id"] not in special_tokens:
                    raise ValueError(f"post_processor TemplateProcessing {name}: special token {body['id']!r} "
                                     f"is not in its special_tokens {sorted(special_tokens)}")

    @staticmethod
    def _piece(piece: dict, where: str) -> tuple[str, dict]:
        if not isinstance(piece, dict) or len(piece) != 1 or next(iter(piece)) not in ("SpecialToken", "Sequence"):
            raise ValueError(f"post_processor TemplateProcessing {where}: piece {piece!r} is not "
                             "{'SpecialToken': ...} or {'Sequence': ...}")
        (kind, body), = piece.items()
        return kind, body

    @classmethod
    def from_json(cls, d: dict, where: str) -> "TemplateProcessing":
        check_fields(d, where, ("single", "pair", "special_tokens"))
        for name, spec in d["special_tokens"].items():
            check_fields(spec, f"{where}.special_tokens[{name!r}]", ("id", "ids", "tokens"))
        return cls(d["single"], d["pair"], d["special_tokens"])

    def to_json(self) -> dict:
        return {"type": "TemplateProcessing", "single": self.single, "pair": self.pair,
                "special_tokens": self.special_tokens}

    def added_tokens(self, is_pair: bool) -> int:
        tmpl = self.pair if is_pair else self.single
        return sum(len(self.special_tokens[b["id"]]["ids"]) for k, b in map(lambda p: self._piece(p, ""), tmpl)
                   if k == "SpecialToken")

    def process(self, encodings: list[Encoding], add_special_tokens: bool) -> list[Encoding]:
        tmpl = self.pair if len(encodings) == 2 else self.single
        tracked = encodings[0].tracked
        out = []
        for piece in tmpl:
            kind, body = self._piece(piece, "template")
            if kind == "Sequence":
                enc = encodings[0 if body["id"] == "A" else 1]
                enc.set_type_id(body.get("type_id", 0))
                out.append(enc)
            elif add_special_tokens:
                spec = self.special_tokens[body["id"]]
                out.append(_special(spec["ids"], spec["tokens"], body.get("type_id", 0), tracked))
        return out


class BertProcessing:
    """[CLS] A [SEP] (+ B [SEP]); sep and cls are (token, id)."""

    def __init__(self, sep: tuple[str, int], cls_: tuple[str, int]) -> None:
        self.sep, self.cls = (sep[0], int(sep[1])), (cls_[0], int(cls_[1]))

    @classmethod
    def from_json(cls, d: dict, where: str) -> "BertProcessing":
        check_fields(d, where, ("sep", "cls"))
        return cls(tuple(d["sep"]), tuple(d["cls"]))

    def to_json(self) -> dict:
        return {"type": "BertProcessing", "sep": list(self.sep), "cls": list(self.cls)}

    def added_tokens(self, is_pair: bool) -> int:
        return 3 if is_pair else 2

    def process(self, encodings: list[Encoding], add_special_tokens: bool) -> list[Encoding]:
        for i, enc in enumerate(encodings):
            enc.set_type_id(i)
        if not add_special_tokens:
            return encodings
        t = encodings[0].tracked
        out = [_special([self.cls[1]], [self.cls[0]], 0, t), encodings[0], _special([self.sep[1]], [self.sep[0]], 0, t)]
        if len(encodings) == 2:
            out += [encodings[1], _special([self.sep[1]], [self.sep[0]], 1, t)]
        return out


class RobertaProcessing(BertProcessing):
    """<s> A </s> (+ </s> B </s>), all type id 0; trim_offsets as ByteLevel does."""

    def __init__(self, sep: tuple[str, int], cls_: tuple[str, int], trim_offsets: bool = True,
                 add_prefix_space: bool = True) -> None:
        super().__init__(sep, cls_)
        self.trim_offsets, self.add_prefix_space = trim_offsets, add_prefix_space

    @classmethod
    def from_json(cls, d: dict, where: str) -> "RobertaProcessing":
        check_fields(d, where, ("sep", "cls"), ("trim_offsets", "add_prefix_space"))
        return cls(tuple(d["sep"]), tuple(d["cls"]), bool(d.get("trim_offsets", True)), bool(d.get("add_prefix_space", True)))

    def to_json(self) -> dict:
        return {"type": "RobertaProcessing", "sep": list(self.sep), "cls": list(self.cls),
                "trim_offsets": self.trim_offsets, "add_prefix_space": self.add_prefix_space}

    def added_tokens(self, is_pair: bool) -> int:
        return 4 if is_pair else 2

    def process(self, encodings: list[Encoding], add_special_tokens: bool) -> list[Encoding]:
        for enc in encodings:
            if self.trim_offsets:
                trim_offsets(enc, self.add_prefix_space)
            enc.set_type_id(0)
        if not add_special_tokens:
            return encodings
        t = encodings[0].tracked
        sep, cls_ = ([self.sep[1]], [self.sep[0]]), ([self.cls[1]], [self.cls[0]])
        out = [_special(*cls_, 0, t), encodings[0], _special(*sep, 0, t)]
        if len(encodings) == 2:
            out += [_special(*sep, 0, t), encodings[1], _special(*sep, 0, t)]
        return out


class Sequence:
    """Post-processors applied in order."""

    def __init__(self, processors: list) -> None:
        self.processors = processors

    @classmethod
    def from_json(cls, d: dict, where: str) -> "Sequence":
        check_fields(d, where, ("processors",))
        return cls([from_json(p, f"{where}.processors[{i}]") for i, p in enumerate(d["processors"])])

    def to_json(self) -> dict:
        return {"type": "Sequence", "processors": [p.to_json() for p in self.processors]}

    def added_tokens(self, is_pair: bool) -> int:
        return sum(p.added_tokens(is_pair) for p in self.processors)

    def process(self, encodings: list[Encoding], add_special_tokens: bool) -> list[Encoding]:
        for p in self.processors:
            encodings = p.process(encodings, add_special_tokens)
        return encodings


POST_PROCESSORS = {"TemplateProcessing": TemplateProcessing, "BertProcessing": BertProcessing,
                   "RobertaProcessing": RobertaProcessing, "ByteLevel": ByteLevel, "Sequence": Sequence}


def from_json(d: dict | None, where: str = "post_processor"):
    """A post-processor from its tokenizer.json object (None stays None)."""
    return None if d is None else dispatch(d, where, POST_PROCESSORS)


def post_process(processor, encodings: list[Encoding], add_special_tokens: bool) -> Encoding:
    """Run `processor` (or HF's default: plain concatenation) and merge into one encoding."""
    for i, enc in enumerate(encodings):
        enc.set_type_id(i)
    if processor is not None:
        encodings = processor.process(encodings, add_special_tokens)
    return Encoding.merge(encodings, encodings[0].tracked if encodings else False)
