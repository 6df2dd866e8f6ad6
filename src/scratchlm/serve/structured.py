"""response_format -> a factory of per-choice JSON constraints (generate/constrained), grammars cached.

    {"type": "text"}                                   no constraint
    {"type": "json_object"}                            any JSON object
    {"type": "json_schema", "json_schema": {"name", "schema"}}   JSON valid under the schema (the subset in
                                                       generate/constrained/schema.py; anything else: 400)
The vocabulary index is built on first use (it walks every token once); compiled grammars are kept per
canonical schema text (LRU, MAX_GRAMMARS) with their mask caches, so repeated schemas cost nothing.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any, Callable

from scratchlm.generate.constrained import GrammarMasks, SchemaError, TokenConstraint, VocabIndex
from scratchlm.generate.constrained import any_object, compile_schema
from scratchlm.serve.protocol import APIError, ResponseFormat

MAX_GRAMMARS = 32
ConstraintFactory = Callable[[], TokenConstraint]


class StructuredOutput:
    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: list[int]) -> None:
        self.tokenizer, self.vocab_size, self.stop_ids = tokenizer, vocab_size, stop_ids
        self._index: VocabIndex | None = None
        self._grammars: OrderedDict[str, GrammarMasks] = OrderedDict()
        self._lock = threading.Lock()

    def index(self) -> VocabIndex:
        with self._lock:
            if self._index is None:
                self._index = VocabIndex.for_tokenizer(self.tokenizer, self.vocab_size)
            return self._index

    def masks(self, key: str, build: Callable[[], Any]) -> GrammarMasks:
        with self._lock:
            hit = self._grammars.get(key)
            if hit is not None:
                self._grammars.move_to_end(key)
                return hit
        masks = GrammarMasks(build(), self.index(), self.stop_ids)
        with self._lock:
            self._grammars[key] = masks
            while len(self._grammars) > MAX_GRAMMARS:
                self._grammars.popitem(last=False)
        return masks

    def factory(self, fmt: ResponseFormat | None) -> GrammarMasks | None:
        """The grammar masks of a response_format (None for text); 400 for a schema outside the subset."""
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return self.masks("json_object", any_object)
        schema = fmt.json_schema.json_schema
        key = json.dumps(schema, sort_keys=True)
        try:
            return self.masks(key, lambda: compile_schema(schema))
        except SchemaError as exc:
            raise APIError(400, f"response_format json_schema: {exc}", param="response_format.json_schema.schema",
                           code="unsupported_schema") from None


def constraint_factory(masks: GrammarMasks | None, budgets: list[int], param: str) -> ConstraintFactory | None:
    """A factory of fresh constraints; 400 when a token budget cannot hold the shortest valid JSON."""
    if masks is None:
        return None
    need = masks.min_tokens()
    if min(budgets) < need:
        raise APIError(400, f"{param}={min(budgets)} is too small for this response_format: the shortest valid "
                       f"JSON needs up to {need} tokens; raise {param} (or leave it out)", param=param)
    return lambda: TokenConstraint(masks)
