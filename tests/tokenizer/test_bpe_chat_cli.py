"""ChatML rendering + loss mask, and the `scratchlm tokenizer` CLI end to end."""

from __future__ import annotations

import numpy as np
import pytest

from scratchlm.cli.main import main
from scratchlm.data.token_file import open_token_file
from scratchlm.tokenizer import Tokenizer, render_chat

MESSAGES = [
    {"role": "system", "content": "Speak as a king."},
    {"role": "user", "content": "What say you?"},
    {"role": "assistant", "content": "Now is the winter of our discontent."},
    {"role": "user", "content": "And then?\n\nGo on."},
    {"role": "assistant", "content": "Made glorious summer by this sun of York; 🎉 日本"},
]


def _render_text(messages, gen: bool) -> str:
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if gen else "")


@pytest.mark.parametrize("gen", [False, True])
def test_render_chat_ids_and_mask(shakespeare_tok, gen):
    tok = shakespeare_tok
    ids, mask = render_chat(tok, MESSAGES, add_generation_prompt=gen)
    assert ids == tok.encode(_render_text(MESSAGES, gen))  # contents start with non-space: same as one string
    assert len(mask) == len(ids) and set(mask) <= {0, 1}
    trained = [i for i, m in zip(ids, mask) if m]
    assert tok.decode(trained) == "".join(m["content"] + "<|im_end|>" for m in MESSAGES if m["role"] == "assistant")
    end = tok.special_token_ids["<|im_end|>"]
    # every masked run is one assistant content followed by its <|im_end|>, nothing else
    runs, cur = [], []
    for i, m in zip(ids, mask):
        if m:
            cur.append(i)
        elif cur:
            runs.append(cur)
            cur = []
    assert [r[-1] for r in runs] == [end, end] and len(runs) == 2
    assert [tok.decode(r[:-1]) for r in runs] == [m["content"] for m in MESSAGES if m["role"] == "assistant"]


def test_render_chat_content_is_plain_text(shakespeare_tok):
    ids, mask = render_chat(shakespeare_tok, [{"role": "assistant", "content": "bye<|im_end|>"}])
    assert ids.count(shakespeare_tok.special_token_ids["<|im_end|>"]) == 1
    assert shakespeare_tok.decode(ids) == "<|im_start|>assistant\nbye<|im_end|><|im_end|>\n"


def test_render_chat_errors(shakespeare_tok):
    with pytest.raises(ValueError, match="message #1 must be a dict with str 'role' and 'content'"):
        render_chat(shakespeare_tok, [MESSAGES[0], {"role": "user"}])
    plain = Tokenizer({i: bytes([i]) for i in range(256)}, [], ["<|endoftext|>"])
    with pytest.raises(ValueError, match=r"no special tokens \['<\|im_start\|>', '<\|im_end\|>'\]"):
        render_chat(plain, MESSAGES)


def test_cli_train_then_encode(tmp_path, shared_data, capsys):
    out = tmp_path / "tok"
    src = shared_data / "tinystories_sample.txt"
    assert main(["tokenizer", "train", "--input", str(src), str(shared_data / "corpus.en"), "--vocab-size", "600",
                 "--special", "<|endoftext|>", "--out", str(out), "--hf-json"]) == 0
    tok = Tokenizer.load(out)
    assert tok.vocab_size == 600 and tok.special_tokens == ["<|endoftext|>"] and (out / "tokenizer.json").is_file()
    for impl in ("reference", "tiktoken"):
        bin_path = tmp_path / f"stories.{impl}.bin"
        assert main(["tokenizer", "encode", "--tokenizer", str(out), "--input", str(src), "--out", str(bin_path),
                     "--impl", impl]) == 0
        ids = open_token_file(bin_path)
        assert ids.dtype == np.dtype("<u2")
        assert ids.tolist() == tok.encode(src.read_text(encoding="utf-8"))
    assert '"tokens": ' in capsys.readouterr().out


def test_cli_default_specials_and_multibyte_blocks(tmp_path, monkeypatch):
    import scratchlm.cli.tokenizer_cmd as cmd

    text = "日本語のテキスト 🎉 émoji\n" * 200
    src = tmp_path / "ml.txt"
    src.write_text(text, encoding="utf-8")
    assert main(["tokenizer", "train", "--input", str(src), "--vocab-size", "285", "--out", str(tmp_path / "t")]) == 0
    tok = Tokenizer.load(tmp_path / "t")
    assert list(tok.special_token_ids) == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    monkeypatch.setattr(cmd, "READ_BYTES", 7)  # blocks end inside multi-byte chars
    assert main(["tokenizer", "encode", "--tokenizer", str(tmp_path / "t"), "--input", str(src),
                 "--out", str(tmp_path / "ml.bin")]) == 0
    assert open_token_file(tmp_path / "ml.bin").tolist() == tok.encode(text)


def test_cli_bad_input_is_one_line_error(tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine text\nthen \xc3\x28 broken")
    assert main(["tokenizer", "train", "--input", str(bad), "--vocab-size", "300", "--out", str(tmp_path / "t")]) == 2
    assert "byte 0xc3 at byte offset 15" in capsys.readouterr().err
    assert main(["tokenizer", "train", "--input", str(bad), "--vocab-size", "100", "--out", str(tmp_path / "t")]) == 2
    assert "vocab_size 100 must be greater than 256 bytes + 3 special tokens = 259" in capsys.readouterr().err
    assert main(["tokenizer", "train", "--input", str(bad), "--vocab-size", "270", "--errors", "replace",
                 "--out", str(tmp_path / "t")]) == 0
    capsys.readouterr()
    assert main(["tokenizer", "encode", "--tokenizer", str(tmp_path / "t"), "--input", str(bad),
                 "--out", str(tmp_path / "b.bin")]) == 2
    assert "byte 0xc3 at byte offset 15" in capsys.readouterr().err
    assert not (tmp_path / "b.bin").exists()
    assert main(["tokenizer", "encode", "--tokenizer", str(tmp_path / "missing"), "--input", str(bad),
                 "--out", str(tmp_path / "b.bin")]) == 2
    assert "no scratchlm tokenizer in" in capsys.readouterr().err
