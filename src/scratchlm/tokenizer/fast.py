"""Fast path: a `tiktoken` encoding built from our vocab and merges (no download), same ids.

tiktoken merges, inside each pre-token, the adjacent pair whose concatenation has the lowest rank;
with rank = token id this is our merge order exactly when ids grow with merge rank (true for
`train_bpe`, GPT-2's files and HF's BpeTrainer), which is checked here. Special tokens are cut out by
`Tokenizer.encode` itself (longest match first), so tiktoken only sees ordinary text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scratchlm.tokenizer.pretokenize import GPT2_PATTERN

if TYPE_CHECKING:
    import tiktoken

    from scratchlm.tokenizer.bpe import Tokenizer


def check_rank_order(tok: "Tokenizer") -> None:
    """ValueError unless byte ids < merged ids and each merge's first result has a larger id than the last."""
    top_byte = max(tok._byte_ids)
    last, seen = top_byte, set()
    for rank, (a, b) in enumerate(tok.merges):
        i = tok._ids[a + b]
        if i in seen:
            continue
        if i <= last:
            raise ValueError(
                f"merge #{rank} {a + b!r} has id {i}, not above the previous merge's id {last}: the tiktoken fast path "
                "needs ids in merge order (as train_bpe, GPT-2 and HF BpeTrainer make them); use impl='reference'"
            )
        seen.add(i)
        last = i


def tiktoken_encoding(tok: "Tokenizer") -> "tiktoken.Encoding":
    """A tiktoken Encoding whose ranks are our ids (specials excluded: `Tokenizer.encode` handles them)."""
    try:
        import tiktoken
    except ImportError:
        raise ValueError("impl='tiktoken' needs the tiktoken package: pip install -e '.[fast]' (tiktoken==0.14.0)") from None
    check_rank_order(tok)
    ranks = dict(tok._ids)
    covered = {tok._ids[a + b] for a, b in tok.merges} | set(tok._byte_ids)
    stray = [i for i in ranks.values() if i not in covered]
    if stray:
        raise ValueError(
            f"tokens {stray[:5]} are neither bytes nor merge results; tiktoken would still use them, so use impl='reference'"
        )
    return tiktoken.Encoding(f"scratchlm-{len(ranks)}", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={})
