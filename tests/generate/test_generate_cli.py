"""`scratchlm generate` and `scratchlm chat` on a tiny checkpoint + a tokenizer trained in the test."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from gen_helpers import build
from scratchlm.model_files import save_model
from scratchlm.cli.main import main
from scratchlm.config import get_preset
from scratchlm.generate import generate
from scratchlm.tokenizer.chat.render import default_stop_ids
from scratchlm.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer, render_chat, train_bpe


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, shared_data: Path) -> tuple[Path, object, Tokenizer]:
    root = tmp_path_factory.mktemp("gen_cli")
    corpus = root / "corpus.txt"
    corpus.write_text((shared_data / "tinyshakespeare.txt").read_text()[:20_000])
    vocab, merges = train_bpe(corpus, 300, DEFAULT_SPECIAL_TOKENS)
    tok = Tokenizer(vocab, merges, DEFAULT_SPECIAL_TOKENS)
    config = get_preset("llama-tiny", vocab_size=tok.vocab_size, d_model=64, n_layers=2, max_seq_len=128,
                        tie_embeddings=False)
    model = build(config, scale=2.0)
    save_model(model, root / "ckpt")
    tok.save(root / "ckpt")
    return root / "ckpt", model, tok


def expected_text(model, tok: Tokenizer, ids: list[int], n: int, **kw) -> str:
    """The library's answer: generate until an end-of-turn id, drop it, decode."""
    stops = default_stop_ids(tok)
    out = generate(model, [ids], n, stop_token_ids=stops, **kw)[0]
    return tok.decode(out[:-1] if out and out[-1] in stops else out)


def test_generate_cli_prints_the_engine_output(checkpoint, capsys) -> None:
    ckpt, model, tok = checkpoint
    rc = main(["generate", "--checkpoint", str(ckpt), "--prompt", "ROMEO:", "--max-new-tokens", "24", "--attn", "reference"])
    assert rc == 0
    want = expected_text(model, tok, tok.encode("ROMEO:"), 24)
    assert len(want) > 5
    assert capsys.readouterr().out == want + "\n"


def test_generate_cli_sampling_flags_reach_the_sampler(checkpoint, capsys) -> None:
    ckpt, model, tok = checkpoint
    flags = ["--temperature", "0.9", "--top-k", "50", "--top-p", "0.95", "--repetition-penalty", "1.1", "--seed", "5"]
    assert main(["generate", "--checkpoint", str(ckpt), "--prompt", "To be", "--max-new-tokens", "16", *flags]) == 0
    want = expected_text(model, tok, tok.encode("To be"), 16, temperature=0.9, top_k=50, top_p=0.95,
                         repetition_penalty=1.1, seed=5)
    assert capsys.readouterr().out == want + "\n"


def test_generate_cli_errors_are_one_line(checkpoint, capsys) -> None:
    ckpt, _, _ = checkpoint
    assert main(["generate", "--checkpoint", str(ckpt), "--prompt", "hi", "--max-new-tokens", "500"]) == 2
    assert "context overflow" in capsys.readouterr().err
    assert main(["generate", "--checkpoint", str(ckpt), "--prompt", "hi", "--top-p", "2"]) == 2
    assert "top_p" in capsys.readouterr().err


@pytest.mark.parametrize("extra", [[], ["--speculative", "ngram"]])
def test_chat_cli_multi_turn(checkpoint, capsys, monkeypatch, extra) -> None:
    """Two turns in the model's template; with --speculative ngram the same replies."""
    ckpt, model, tok = checkpoint
    monkeypatch.setattr("sys.stdin", io.StringIO("Hello there\nWhat now?\n/exit\n"))
    assert main(["chat", "--checkpoint", str(ckpt), "--max-new-tokens", "12", "--system", "Be brief.", *extra]) == 0
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    reply1 = expected_text(model, tok, render_chat(tok, messages, add_generation_prompt=True)[0], 12)
    messages += [{"role": "assistant", "content": reply1}, {"role": "user", "content": "What now?"}]
    reply2 = expected_text(model, tok, render_chat(tok, messages, add_generation_prompt=True)[0], 12)
    assert capsys.readouterr().out == reply1 + "\n" + reply2 + "\n"


def test_chat_drops_oldest_turns_when_context_is_full(checkpoint, capsys, monkeypatch) -> None:
    ckpt, _, tok = checkpoint
    line = "the king is dead, long live the king " * 2
    one_turn = len(render_chat(tok, [{"role": "user", "content": line}], add_generation_prompt=True)[0])
    max_new = 128 - one_turn - 1  # one turn fits; two never do
    monkeypatch.setattr("sys.stdin", io.StringIO(f"{line}\n{line}\n{line}\n"))
    assert main(["chat", "--checkpoint", str(ckpt), "--max-new-tokens", str(max_new)]) == 0
    captured = capsys.readouterr()
    assert "dropped" in captured.err and captured.out.count("\n") == 3


@pytest.mark.parametrize("flags", [["--speculative", "ngram", "--draft-tokens", "3"], ["--draft-model", "SELF"]])
def test_generate_cli_speculative_prints_the_plain_greedy_text(checkpoint, capsys, flags) -> None:
    """--speculative ngram / --draft-model (the model drafting for itself: every draft accepted) print exactly
    the engine's plain greedy text."""
    ckpt, model, tok = checkpoint
    flags = [str(ckpt) if f == "SELF" else f for f in flags]
    prompt = "ROMEO: a rose, a rose, a rose, a rose by any"
    assert main(["generate", "--checkpoint", str(ckpt), "--prompt", prompt, "--max-new-tokens", "24",
                 "--decode", "fast", *flags]) == 0
    want = expected_text(model, tok, tok.encode(prompt), 24, decode="fast")
    assert len(want) > 5 and capsys.readouterr().out == want + "\n"


def test_generate_cli_speculative_errors_are_one_line(checkpoint, capsys) -> None:
    ckpt, _, _ = checkpoint
    assert main(["generate", "--checkpoint", str(ckpt), "--prompt", "hi", "--speculative", "draft"]) == 2
    assert "needs --draft-model" in capsys.readouterr().err
    assert main(["generate", "--checkpoint", str(ckpt), "--prompt", "hi", "--speculative", "ngram",
                 "--draft-tokens", "0"]) == 2
    assert "--draft-tokens 0 must be in [1, 32]" in capsys.readouterr().err
