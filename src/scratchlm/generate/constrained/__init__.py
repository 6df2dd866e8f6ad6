"""Constrained decoding: token masks that keep generated text valid JSON under a JSON Schema subset.

    schema.py        JSON Schema subset -> grammar nodes (SchemaError outside the subset)
    json_machine.py  byte-level pushdown automaton over those nodes, with the cost to complete
    vocab_index.py   the vocabulary as a byte trie + precomputed string-content sets
    token_mask.py    per-state token masks (cached) and the per-sequence TokenConstraint
"""

from scratchlm.generate.constrained.json_machine import JsonMachine
from scratchlm.generate.constrained.schema import Grammar, SchemaError, any_object, compile_schema
from scratchlm.generate.constrained.token_mask import GrammarMasks, TokenConstraint
from scratchlm.generate.constrained.vocab_index import VocabIndex

__all__ = ["Grammar", "GrammarMasks", "JsonMachine", "SchemaError", "TokenConstraint", "VocabIndex",
           "any_object", "compile_schema"]
