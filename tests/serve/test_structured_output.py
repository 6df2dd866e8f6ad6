"""response_format through the official openai client: json_schema and json_object, chat and completions,
streamed and not, sampled with n choices. The random-weight model knows nothing of JSON, so every valid
output is the constrained decoder's doing; each must parse (json) and validate (jsonschema)."""

from __future__ import annotations

import json
import random

import jsonschema
import openai
import pytest

from serve_helpers import client
from json_schemas import random_schema
from tiny_checkpoint import MODEL

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "role": {"enum": ["king", "fool", "ghost"]},
        "alive": {"type": "boolean"},
        "titles": {"type": "array", "items": {"type": "string"}},
        "home": {"type": "object", "properties": {"city": {"type": "string"}, "lat": {"type": ["number", "null"]}},
                 "required": ["city"], "additionalProperties": False},
    },
    "required": ["name", "age", "role", "home"],
    "additionalProperties": False,
}
CHAT = [{"role": "user", "content": "Describe a character of the play as JSON."}]


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


def test_chat_json_schema_sampled_choices_validate(server):
    out = client(server).chat.completions.create(model=MODEL, messages=CHAT, temperature=1.0, n=4, seed=3,
                                                 max_tokens=200, response_format=schema_format(PERSON))
    assert len(out.choices) == 4
    for choice in out.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), PERSON)


def test_chat_json_schema_streamed(server):
    stream = client(server).chat.completions.create(model=MODEL, messages=CHAT, temperature=0.9, seed=7, stream=True,
                                                    max_tokens=200, response_format=schema_format(PERSON))
    text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    jsonschema.validate(json.loads(text), PERSON)


def test_json_object_completions_and_chat(server):
    c = client(server)
    out = c.completions.create(model=MODEL, prompt="{", max_tokens=120, temperature=1.0, n=3, seed=1,
                               extra_body={"response_format": {"type": "json_object"}})
    for choice in out.choices:
        assert isinstance(json.loads(choice.text), dict)
    chat = c.chat.completions.create(model=MODEL, messages=CHAT, temperature=0, max_tokens=60,
                                     response_format={"type": "json_object"})
    assert isinstance(json.loads(chat.choices[0].message.content), dict)


def test_tight_budget_still_completes(server):
    """max_tokens just above the shortest valid text: the masks steer the output to close in time."""
    schema = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "array", "items": {}}},
              "required": ["a", "b"]}
    for seed in range(3):
        out = client(server).chat.completions.create(model=MODEL, messages=CHAT, temperature=1.0, seed=seed,
                                                     max_tokens=len('{"a":"","b":[]}') + 2,
                                                     response_format=schema_format(schema))
        jsonschema.validate(json.loads(out.choices[0].message.content), schema)


def test_random_schemas_through_the_server(server):
    rng = random.Random(11)
    c = client(server)
    for i in range(8):
        schema = random_schema(rng)
        out = c.chat.completions.create(model=MODEL, messages=CHAT, temperature=1.0, seed=i, n=2, max_tokens=150,
                                        response_format=schema_format(schema))
        for choice in out.choices:
            jsonschema.validate(json.loads(choice.message.content), schema)


def test_outside_the_subset_is_a_400(server):
    with pytest.raises(openai.BadRequestError) as exc:
        client(server).chat.completions.create(
            model=MODEL, messages=CHAT, response_format=schema_format({"type": "string", "format": "email"}))
    assert "'format'" in exc.value.message and exc.value.code == "unsupported_schema"
