"""scratchlm eval against independent references: pass@k by enumeration, Wilson by a textbook value,
perplexity and option log-likelihoods from a transformers Llama with the same weights, greedy accuracy
from HF `generate`; and the command line."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from scratchlm.align.rewards import get_reward
from scratchlm.align.toy_task import byte_tokenizer
from scratchlm.model_files import save_model
from scratchlm.cli.main import main
from scratchlm.config import get_preset
from scratchlm.data.align_data import RLPrompt, encode_prompt
from scratchlm.eval.accuracy import evaluate_accuracy, grade_samples
from scratchlm.eval.choice import ChoiceItem, encode_pair, evaluate_choices
from scratchlm.eval.perplexity import perplexity
from scratchlm.eval.stats import mean_interval, pass_at_k, wilson_interval
from scratchlm.interop.hf.config_json import config_to_hf
from scratchlm.model import TransformerLM


@pytest.fixture(scope="module")
def pair():
    """Our model (byte vocab) and a transformers Llama with identical weights."""
    torch.manual_seed(0)
    cfg = get_preset("llama-tiny", vocab_size=259, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2,
                     rope_style="half", tie_embeddings=False, max_seq_len=64)
    ours = TransformerLM(cfg).eval()
    with torch.no_grad():
        for p in ours.parameters():
            p.mul_(4.0)  # sharper distributions: less degenerate greedy text
    hf = LlamaForCausalLM(LlamaConfig(**config_to_hf(cfg, "llama"))).eval()
    hf.load_state_dict(ours.state_dict(), strict=True)
    return ours, hf, byte_tokenizer()


def test_pass_at_k_equals_enumeration_and_intervals():
    for n, c, k in [(5, 0, 1), (5, 2, 1), (5, 2, 3), (6, 3, 4), (4, 4, 2), (7, 1, 7)]:
        hits = [any(i < c for i in subset) for subset in itertools.combinations(range(n), k)]
        assert pass_at_k(n, c, k) == pytest.approx(sum(hits) / len(hits), abs=1e-12)
    lo, hi = wilson_interval(8, 10)  # the textbook example: 95% Wilson for 8/10
    assert (round(lo, 4), round(hi, 4)) == (0.4902, 0.9433)
    lo, hi = mean_interval([0.5, 1.0, 0.0, 0.5])  # fractional: mean 0.5, sd sqrt(1/6)
    assert hi - 0.5 == pytest.approx(1.959964 * math.sqrt(1 / 6) / 2, rel=1e-5)
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(2, 1, 3)


def test_grading_and_pass_at_k_summary_hand_worked():
    problems = [RLPrompt("a", "", {"answer": "4"}), RLPrompt("b", "", {"answer": "1/2"})]
    texts = [["The answer is 4.", "\\boxed{5}", "#### 4"], ["0.5", "no idea", "2"]]
    out = grade_samples(problems, texts, get_reward("math"), [1, 2])
    assert [it["correct"] for it in out["items"]] == [[True, False, True], [True, False, False]]
    s = out["summary"]
    assert s["pass@1"] == pytest.approx((2 / 3 + 1 / 3) / 2) and s["sample_accuracy"] == pytest.approx(0.5)
    assert s["pass@2"] == pytest.approx((1 - 0 + 1 - 1 / 3) / 2)  # 1 - C(n-c,2)/C(3,2): 1 and 2/3


def _reference_nll(hf, ids: list[int], window: int, stride: int) -> tuple[float, int]:
    """Windows start at 0, S, 2S, ... until one reaches the end; token t >= 1 is scored by the FIRST
    window [b, b + W) that holds both t - 1 and t, from HF's logits."""
    starts = []
    for b in range(0, max(len(ids) - 1, 1), stride):
        starts.append(b)
        if b + window >= len(ids):
            break
    total, n = 0.0, 0
    for t in range(1, len(ids)):
        b = next((b for b in starts if b <= t - 1 and t < b + window), None)
        if b is None:
            continue
        with torch.no_grad():
            logits = hf(torch.tensor([ids[b:t + 1]])).logits[0, -2]
        total -= float(torch.log_softmax(logits.double(), -1)[ids[t]])
        n += 1
    return total, n


@pytest.mark.parametrize("window,stride", [(16, 16), (16, 5), (64, 64)])
def test_perplexity_equals_the_transformers_model(pair, window, stride, one_torch_thread):
    ours, hf, _ = pair
    g = torch.Generator().manual_seed(1)
    docs = [torch.randint(0, 259, (n,), generator=g).tolist() for n in (40, 9, 2)]
    got = perplexity(ours, docs, window, stride, batch_size=3, progress=False)
    parts = [_reference_nll(hf, d, window, stride) for d in docs]
    nll, n = sum(p[0] for p in parts), sum(p[1] for p in parts)
    assert got["tokens"] == n
    assert got["nll"] == pytest.approx(nll / n, rel=1e-5) and got["perplexity"] == pytest.approx(math.exp(nll / n),
                                                                                                 rel=1e-5)


def test_multiple_choice_scores_equal_the_transformers_model(pair):
    ours, hf, tok = pair
    items = [ChoiceItem("Q: 1+1= ", ["2", "3", "11"], 0), ChoiceItem("Sky is", [" blue", " green"], 1)]
    out = evaluate_choices(ours, tok, items, batch_size=2, progress=False)
    for it, rec in zip(items, out["items"]):
        want = []
        for opt in it.choices:
            ctx, cont = encode_pair(tok, it.prompt, opt)
            assert ctx + cont == tok.encode(it.prompt.rstrip() + " " * (it.prompt != it.prompt.rstrip()) + opt)
            with torch.no_grad():
                lp = torch.log_softmax(hf(torch.tensor([ctx + cont])).logits[0].double(), -1)
            want.append(sum(float(lp[len(ctx) + j - 1, t]) for j, t in enumerate(cont)))
        assert rec["logprobs"] == pytest.approx(want, rel=1e-5)
        assert rec["predicted"]["acc"] == max(range(len(want)), key=want.__getitem__)
        norm = [w / len(c) for w, c in zip(want, it.choices)]
        assert rec["predicted"]["acc_norm"] == max(range(len(norm)), key=norm.__getitem__)
    s = out["summary"]
    assert s["acc"] == sum(r["predicted"]["acc"] == it.answer for r, it in zip(out["items"], items)) / 2


def test_greedy_accuracy_matches_transformers_generate(pair):
    """Half the answers are what HF's greedy decoding writes, half are not: accuracy must be exactly 0.5."""
    ours, hf, tok = pair
    end = tok.special_token_ids["<|endoftext|>"]
    prompts = [f"{a}+{b}=" for a in range(3) for b in range(2)]
    problems = []
    for i, p in enumerate(prompts):
        ids = encode_prompt(tok, p)
        with torch.no_grad():
            out = hf.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False, eos_token_id=end,
                              pad_token_id=end)[0, len(ids):].tolist()
        text = tok.decode([t for t in out if t != end])
        problems.append(RLPrompt(p, "", {"answer": text if i % 2 == 0 else text + "x"}))
    assert sum(len(p.fields["answer"]) >= 3 for p in problems) >= 4  # real text, not empty completions
    res = evaluate_accuracy(ours, tok, problems, get_reward("exact_match"), max_new_tokens=6, progress=False)
    assert [it["correct"] for it in res["items"]] == [[i % 2 == 0] for i in range(len(prompts))]
    assert res["summary"]["pass@1"] == 0.5


def test_eval_command_line(pair, tmp_path, capsys):
    ours, _, tok = pair
    save_model(ours, tmp_path / "m")
    tok.save(tmp_path / "m")
    (tmp_path / "t.jsonl").write_text(json.dumps({"text": "hello world, hello again"}) + "\n")
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"prompt": f"{a}+1=", "answer": str(a + 1)}) + "\n"
                                              for a in range(3)))
    (tmp_path / "c.jsonl").write_text(json.dumps({"question": "2+2=", "choices": ["4", "5"], "answer": "A"}) + "\n")
    common = ["eval", "--checkpoint", str(tmp_path / "m"), "--threads", "1", "--no-progress"]
    for task, data, extra, key in [("perplexity", "t.jsonl", ["--seq-len", "16", "--stride", "8"], "perplexity"),
                                   ("accuracy", "p.jsonl", ["--samples", "3", "--k", "1,3", "--temperature", "1",
                                                            "--max-new-tokens", "4"], "pass@3"),
                                   ("choice", "c.jsonl", [], "acc_norm")]:
        assert main(common + ["--task", task, "--data", str(tmp_path / data), "--out", str(tmp_path / f"{task}.json"),
                              *extra]) == 0
        captured = capsys.readouterr()
        summary = json.loads(captured.out.strip().splitlines()[-1])
        assert summary["task"] == task and 0 <= summary[key] and key in captured.err  # the table
        assert json.loads((tmp_path / f"{task}.json").read_text())["summary"][key] == summary[key]
    assert main(common + ["--task", "accuracy", "--data", str(tmp_path / "p.jsonl"), "--samples", "2"]) == 2
    assert "identical samples" in capsys.readouterr().err
    assert main(common + ["--task", "accuracy", "--data", str(tmp_path / "p.jsonl"), "--k", "5"]) == 2
    assert "k <= samples" in capsys.readouterr().err
