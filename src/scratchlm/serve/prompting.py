"""From a validated request to generation jobs: prompt token ids, token budgets, sampling params.

Context policy (no silent truncation): a prompt of P tokens needs P <= M - 1 (M = max_seq_len) and
P + max_tokens <= M; otherwise a 400 says by how much. When max_tokens is not given, completions use
OpenAI's default of 16 and chat uses the rest of the context, both capped at M - P.
Completions stop at <|endoftext|>; chat stops at <|im_end|> or <|endoftext|> (the tokens the
tokenizer has); `stop` strings end a choice with the text before them.

Tokenizing is slow in pure Python (~1 MB/s), so the server runs `completion_job` / `chat_job` on a worker
thread, and first calls `check_size`, which needs no tokenizer: a token covers at most B bytes of text
(B = the longest token), so a text of N bytes has at least ceil(N / B) tokens; when even that bound does
not fit the context the request is refused at once (a 1 MB prompt costs microseconds, not seconds).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from scratchlm.generate.sampling import SamplingParams
from scratchlm.tokenizer.chat.render import default_stop_ids
from scratchlm.serve.protocol import APIError, ChatMessage, ChatRequest, CompletionRequest, SamplingFields
from scratchlm.serve.structured import ConstraintFactory, StructuredOutput, constraint_factory
from scratchlm.serve.tools import ToolPlan, call_grammar, chatml_tool_messages, plan_tools, template_messages
from scratchlm.tokenizer.chat.render import render_chat

COMPLETION_DEFAULT_MAX_TOKENS = 16
MAX_CHOICES = 64  # prompts x n per request
EOT = "<|endoftext|>"
NORMALIZER_SLACK = 3  # a normalizer (NFC, NFKC) may shrink text up to this factor before tokenizing


@dataclass(frozen=True)
class JobSpec:
    """What to generate for one request: choice i*n + j continues prompts[i] (its j-th sample)."""

    prompts: list[list[int]]
    max_tokens: list[int]
    n: int
    params: SamplingParams
    stop_token_ids: tuple[int, ...]
    stop_strings: tuple[str, ...]
    seed: int | None
    top_logprobs: int | None = None
    echo: bool = False
    constraint: ConstraintFactory | None = None
    tools: ToolPlan | None = None

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)


@dataclass
class JobContext:
    """What job building needs from the server: the tokenizer and the model's limits."""

    tokenizer: Any
    context: int
    vocab_size: int
    structured: StructuredOutput
    model_stops: list[int] | None = None  # the model's eos / end-of-turn ids, when it names them
    chat_stops: list[int] | None = None
    template: Any = None  # the model's own chat template (tokenizer.jinja_template.ChatTemplate); None: ChatML

    def __post_init__(self) -> None:
        vocab = getattr(self.tokenizer, "vocab", None)
        longest = max((len(v) for v in vocab.values()), default=1) if isinstance(vocab, dict) else 64
        slack = NORMALIZER_SLACK if getattr(self.tokenizer, "normalizer", None) is not None else 1
        self.bytes_per_token = max(longest, 1) * slack


def check_size(req: SamplingFields, ctx: JobContext) -> None:
    """400 before any tokenizing when a prompt's text is certainly longer than the context."""
    if isinstance(req, CompletionRequest):
        texts = [req.prompt] if isinstance(req.prompt, str) else [p for p in req.prompt if isinstance(p, str)]
        param = "prompt"
    else:
        texts = ["".join(m.text() for m in req.messages)]
        param = "messages"
    for text in texts:
        size = len(text.encode("utf-8", errors="surrogatepass"))
        at_least = -(-size // ctx.bytes_per_token)
        if at_least > ctx.context - 1:
            raise APIError(400, f"the prompt has at least {at_least} tokens ({size} bytes of text) but this model's "
                           f"context is {ctx.context} tokens; shorten the prompt to at most {ctx.context - 1} tokens",
                           param=param, code="context_length_exceeded")


def token_budget(prompt_len: int, requested: int | None, default: int | None, context: int, param: str,
                 prompt_param: str) -> int:
    """max_tokens for a prompt of prompt_len tokens, or a 400 when it cannot fit the context."""
    if prompt_len > context - 1:
        raise APIError(400, f"the prompt has {prompt_len} tokens but this model's context is {context} tokens and "
                       f"at least 1 must remain for the completion; shorten the prompt to at most {context - 1} "
                       "tokens", param=prompt_param, code="context_length_exceeded")
    room = context - prompt_len
    if requested is None:
        return room if default is None else min(default, room)
    if prompt_len + requested > context:
        raise APIError(400, f"this model's maximum context length is {context} tokens, but you requested "
                       f"{prompt_len + requested} ({prompt_len} in the prompt + {param}={requested}); set {param} "
                       f"to at most {room} or shorten the prompt", param=param, code="context_length_exceeded")
    return requested


def sampling_params_of(req: SamplingFields) -> SamplingParams:
    try:
        return SamplingParams(temperature=req.temperature, top_k=req.top_k, top_p=req.top_p, min_p=req.min_p,
                              repetition_penalty=req.repetition_penalty, frequency_penalty=req.frequency_penalty,
                              presence_penalty=req.presence_penalty)
    except ValueError as exc:
        raise APIError(400, str(exc)) from None


def _seed(req: SamplingFields) -> int | None:
    return None if req.seed is None else req.seed % (1 << 63)


def completion_prompts(req: CompletionRequest, tokenizer: Any, vocab_size: int) -> list[list[int]]:
    """The request's prompt(s) as token ids: a string, strings, ids or lists of ids (empty -> [<|endoftext|>])."""
    raw = req.prompt
    items: list[Any] = [raw] if isinstance(raw, str) or (raw and isinstance(raw[0], int)) else list(raw)
    if not items:
        raise APIError(400, "prompt is an empty list; send a string or a list of token ids", param="prompt")
    prompts = []
    for item in items:
        ids = tokenizer.encode(item) if isinstance(item, str) else list(item)
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise APIError(400, f"prompt token id {bad[0]} is outside the vocabulary [0, {vocab_size})",
                           param="prompt")
        if not ids:
            eot = tokenizer.special_token_ids.get(EOT)
            if eot is None:
                raise APIError(400, "the prompt is empty; send at least one token of text", param="prompt")
            ids = [eot]
        prompts.append(ids)
    return prompts


def completion_job(req: CompletionRequest, ctx: JobContext) -> JobSpec:
    prompts = completion_prompts(req, ctx.tokenizer, ctx.vocab_size)
    if len(prompts) * req.n > MAX_CHOICES:
        raise APIError(400, f"{len(prompts)} prompts x n={req.n} = {len(prompts) * req.n} choices exceeds the limit of "
                       f"{MAX_CHOICES} per request; split the prompts over several requests", param="prompt")
    budgets = [token_budget(len(p), req.max_tokens, COMPLETION_DEFAULT_MAX_TOKENS, ctx.context, "max_tokens",
                            "prompt") for p in prompts]
    if ctx.model_stops:
        stop_ids = tuple(ctx.model_stops)
    else:
        eot = ctx.tokenizer.special_token_ids.get(EOT)
        stop_ids = () if eot is None else (eot,)
    constraint = constraint_factory(ctx.structured.factory(req.response_format), budgets, "max_tokens")
    return JobSpec(prompts, budgets, req.n, sampling_params_of(req), stop_ids, req.stop_strings(), _seed(req),
                   req.logprobs, req.echo, constraint)


def render_messages(messages: list[ChatMessage], ctx: JobContext, add_generation_prompt: bool = True,
                    tools: list[dict] | None = None) -> list[int]:
    """Token ids of a conversation: the model's own template (tools passed to it as transformers does), or
    scratchlm's ChatML (tools as a system message, see serve/tools.py). Developer messages are system ones."""
    msgs = template_messages(messages)
    try:
        if ctx.template is not None:
            text = ctx.template.render(msgs, add_generation_prompt=add_generation_prompt, tools=tools)
            return list(ctx.tokenizer.encode(text))
        named = [i for i, m in enumerate(msgs) if m.get("name") and m["role"] != "tool"]
        if named:
            raise APIError(400, f"messages[{named[0]}] has a name, which ChatML has no place for; remove it",
                           param=f"messages.{named[0]}.name")
        plain = chatml_tool_messages(msgs, tools)
        return render_chat(ctx.tokenizer, plain, add_generation_prompt=add_generation_prompt)[0]
    except ValueError as exc:
        raise APIError(400, str(exc), param="messages") from None


def chat_job(req: ChatRequest, ctx: JobContext) -> JobSpec:
    source = None if ctx.template is None else ctx.template.select(None, req.tools or None)
    plan = plan_tools(req.tool_dicts(), req.tool_choice_value(), source)
    ids = render_messages(req.messages, ctx, tools=None if plan is None else plan.tools)
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    budget = token_budget(len(ids), req.token_limit, None, ctx.context, param, "messages")
    stop_ids = tuple(ctx.chat_stops if ctx.chat_stops is not None else default_stop_ids(ctx.tokenizer))
    if plan is not None and plan.constrained:
        key = json.dumps(["tools", plan.format, plan.forced, plan.tools], sort_keys=True)
        masks = ctx.structured.masks(key, lambda: call_grammar(plan))
    else:
        masks = ctx.structured.factory(req.response_format)
    constraint = constraint_factory(masks, [budget], param)
    return JobSpec([ids], [budget], req.n, sampling_params_of(req), stop_ids, req.stop_strings(), _seed(req),
                   req.top_logprobs_n, False, constraint, plan)
