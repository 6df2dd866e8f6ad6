"""BPE training: hand-worked merges (tie-breaking included), incremental counts == naive recount,
exact parallel chunking, and bad input."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from scratchlm.tokenizer import train_bpe
from scratchlm.tokenizer.training.corpus_chunks import chunk_bounds, count_pretokens

# GPT-2's split pattern as published in openai/gpt-2 encoder.py (independent of our module).
GPT2_PAT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def _train(tmp_path: Path, text: str, vocab_size: int, specials=None, **kw):
    path = tmp_path / "corpus.txt"
    path.write_text(text, encoding="utf-8")
    return train_bpe(path, vocab_size, specials, num_workers=1, **kw)


def test_hand_worked_two_merges(tmp_path):
    # pre-tokens "ab" x1, " ab" x2 -> count(a,b)=3 > count(' ',a)=2: merge "ab"; then (' ', "ab") x2.
    vocab, merges = _train(tmp_path, "ab ab ab", 258)
    assert merges == [(b"a", b"b"), (b" ", b"ab")]
    assert vocab[256] == b"ab" and vocab[257] == b" ab" and len(vocab) == 258


def test_hand_worked_ties_go_to_greater_pair(tmp_path):
    # pre-tokens "ab", " cd": all pairs count 1. Greatest pair first: (c,d) > (a,b) > (' ',c);
    # then (a,b) > (' ',"cd") because b"a" > b" "; finally (' ', "cd").
    vocab, merges = _train(tmp_path, "ab cd", 259)
    assert merges == [(b"c", b"d"), (b"a", b"b"), (b" ", b"cd")]


def test_hand_worked_longer_token_beats_its_prefix(tmp_path):
    # pre-tokens "abx", " ab", " ay".  Counts: (a,b)=2, (' ',a)=2, (b,x)=1, (a,y)=1.
    # 1: tie at 2, b"a" > b" "                               -> (a, b)
    # 2: all 1: (ab,x) (' ',ab) (' ',a) (a,y); b"ab" > b"a"   -> (ab, x)   (a prefix sorts lower)
    # 3: (' ',ab) (' ',a) (a,y): b"a" > b" "                  -> (a, y)
    # 4: (' ',ab) (' ',ay): second parts b"ay" > b"ab"        -> (' ', ay)
    # 5:                                                      -> (' ', ab)
    vocab, merges = _train(tmp_path, "abx ab ay", 261)
    assert merges == [(b"a", b"b"), (b"ab", b"x"), (b"a", b"y"), (b" ", b"ay"), (b" ", b"ab")]
    assert [vocab[i] for i in range(256, 261)] == [b"ab", b"abx", b"ay", b" ay", b" ab"]


def test_overlapping_pair_merges_left_to_right(tmp_path):
    # "aaaaa" x1: count(a,a) = 4 -> "aa"; word becomes [aa, aa, a]: (aa,aa)=1, (aa,a)=1 -> (aa,a) wins
    # the tie (b"aa"+b"a" vs b"aa"+b"aa": second part b"aa" > b"a", so (aa,aa) wins).
    vocab, merges = _train(tmp_path, "aaaaa", 258)
    assert merges == [(b"a", b"a"), (b"aa", b"aa")]


def test_specials_are_never_merged_across(tmp_path):
    vocab, merges = _train(tmp_path, "xy<|endoftext|>xy<|endoftext|>yx", 259, ["<|endoftext|>"])
    assert vocab[256] == b"<|endoftext|>"
    assert all(b"<" not in a + b and b"|" not in a + b for a, b in merges)
    assert (b"y", b"<") not in merges and merges[0] == (b"x", b"y")


def test_files_are_separate_documents_and_exhaustion_warns(tmp_path):
    (tmp_path / "a.txt").write_text("ab")
    (tmp_path / "b.txt").write_text("c")
    with pytest.warns(UserWarning, match="ran out of pairs"):
        vocab, merges = train_bpe([tmp_path / "a.txt", tmp_path / "b.txt"], 260, num_workers=1)
    assert merges == [(b"a", b"b")] and len(vocab) == 257  # "abc" never exists: no (b, c) pair


def _naive_train(counts: dict[bytes, int], vocab_size: int) -> list[tuple[bytes, bytes]]:
    """Textbook BPE: recount every pair of every word after each merge; max by (count, pair bytes)."""
    words = {tuple(bytes([c]) for c in w): f for w, f in counts.items()}
    tokens = {bytes([b]) for b in range(256)}
    merges = []
    while len(tokens) < vocab_size:
        pairs: Counter = Counter()
        for w, f in words.items():
            for p in zip(w, w[1:]):
                pairs[p] += f
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append((a, b))
        tokens.add(a + b)
        new_words: Counter = Counter()
        for w, f in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new_words[tuple(out)] += f
        words = new_words
    return merges


@pytest.mark.parametrize("name,n_lines,vocab_size", [("corpus.en", 300, 420), ("tinystories_sample.txt", 100, 520)])
def test_incremental_counts_equal_naive_recount(shared_data, tmp_path, name, n_lines, vocab_size):
    text = "".join((shared_data / name).read_text(encoding="utf-8").splitlines(keepends=True)[:n_lines])
    docs = text.split("<|endoftext|>")
    counts = Counter(t.encode() for doc in docs for t in regex.findall(GPT2_PAT, doc))
    vocab, merges = _train(tmp_path, text, vocab_size + 1, ["<|endoftext|>"])
    assert merges == _naive_train(counts, vocab_size)
    assert set(vocab.values()) == {bytes([b]) for b in range(256)} | {a + b for a, b in merges} | {b"<|endoftext|>"}


TRICKY = st.lists(
    st.sampled_from(["a", "Z", "é", "日", "1", "'", "'re", " ", "  ", "\n", "\n\n", "\t", " \n", "x\ny", ".", "!\n", "日\n本", "é\n", "\nΩ",
                     "<|endoftext|>", "<|im_start|>", "\u3000", "🎉"]),
    max_size=80,
).map("".join)


@settings(max_examples=60, deadline=None)
@given(text=TRICKY, chunk=st.integers(1, 24))
def test_chunk_cuts_do_not_change_pretoken_counts(tmp_path_factory, text, chunk):
    path = tmp_path_factory.mktemp("c") / "t.txt"
    path.write_text(text, encoding="utf-8")
    specials = ("<|endoftext|>", "<|im_start|>")
    whole = count_pretokens([path], specials, num_workers=1, chunk_bytes=1 << 20)
    chunked = count_pretokens([path], specials, num_workers=1, chunk_bytes=chunk)
    assert chunked == whole
    data = path.read_bytes()
    bounds = list(chunk_bounds(path, specials, chunk))
    assert [s for s, _ in bounds[1:]] == [e for _, e in bounds[:-1]] and (not data or bounds[-1][1] == len(data))
    for _, end in bounds[:-1]:  # each cut: a special starts there, or it follows "x\nY", x and Y not spaces
        before, after = data[:end].decode(), data[end:].decode()
        assert after.startswith(specials) or (before[-1] == "\n" and not before[-2].isspace() and not after[0].isspace())


def test_parallel_workers_equal_single_process(shared_data):
    for name, specials in (("tinystories_sample.txt", ["<|endoftext|>"]), ("corpus.en", [])):
        path = shared_data / name
        one = train_bpe(path, 400, specials, num_workers=1)
        two = train_bpe(path, 400, specials, num_workers=2, chunk_bytes=1000)
        assert len(list(chunk_bounds(path, tuple(specials), 1000))) >= 3
        assert two == one


def test_non_ascii_text_is_cut_at_newlines_between_letters(tmp_path):
    path = tmp_path / "ja.txt"
    path.write_text("日本語のテキスト\n\u3000字下げ\n" * 400 + "Ωμέγα\n" * 400, encoding="utf-8")
    bounds = list(chunk_bounds(path, (), 2000))
    assert len(bounds) >= 9  # 19.6 kB in ~2 kB chunks
    assert count_pretokens([path], (), num_workers=2, chunk_bytes=2000) == count_pretokens([path], (), num_workers=1)


def test_vocab_size_too_small(tmp_path):
    with pytest.raises(ValueError, match=r"vocab_size 257 must be greater than 256 bytes \+ 1 special tokens = 257"):
        _train(tmp_path, "hello", 257, ["<|endoftext|>"])


@pytest.mark.parametrize("text", ["", "<|endoftext|><|endoftext|>"])
def test_empty_corpus(tmp_path, text):
    with pytest.raises(ValueError, match="is empty"):
        _train(tmp_path, text, 300, ["<|endoftext|>"])


def test_non_utf8_input_names_byte_offset(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"hello \xff world")
    with pytest.raises(ValueError, match=r"byte 0xff at byte offset 6.*errors='replace'"):
        train_bpe(path, 300, num_workers=1)
    replaced = Counter(t.encode() for t in regex.findall(GPT2_PAT, "hello \ufffd world"))
    assert count_pretokens([path], (), errors="replace") == replaced
    vocab, merges = train_bpe(path, 258, num_workers=1, errors="replace")
    assert b"\xef\xbf" in vocab.values()  # the first merge is inside U+FFFD = EF BF BD (greatest tied pair)


def test_missing_input_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        train_bpe(tmp_path / "nope.txt", 300)
