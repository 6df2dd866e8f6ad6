"""`scratchlm viz ...`: PNG plots that explain the model.

    scratchlm viz rope-decay --out rope.png [--head-dim 128 --base 10000 --max-distance 256]
    scratchlm viz attention --checkpoint DIR --prompt "To be or not" --out attn.png [--layer 0]
    scratchlm viz loss --metrics runs/quickstart/metrics.jsonl --out loss.png
    scratchlm viz sampling --checkpoint DIR --prompt "Once upon a" --top-k 10 --top-p 0.9 --min-p 0.05 --out dist.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from scratchlm.cli.outputs import add_output_arg


def _load(checkpoint: str):
    from scratchlm.load import load_pretrained

    loaded = load_pretrained(checkpoint, dtype=torch.float32, keep_quantized=False)
    return loaded.model, loaded.tokenizer


def _prompt_ids(tok, prompt: str, max_len: int) -> torch.Tensor:
    ids = tok.encode(prompt)
    if not ids:
        raise ValueError("--prompt encodes to zero tokens; give a non-empty prompt")
    if len(ids) > max_len:
        raise ValueError(f"--prompt is {len(ids)} tokens, more than the model context {max_len}; shorten it")
    return torch.tensor([ids])


def _token_label(tok, i: int) -> str:
    return repr(tok.decode([i]))[1:-1] or f"<{i}>"


def run_rope(args: argparse.Namespace) -> int:
    from scratchlm.viz.rope_decay import plot_rope_decay

    if args.head_dim <= 0 or args.head_dim % 2:
        raise ValueError(f"--head-dim must be a positive even number, got {args.head_dim}")
    print(plot_rope_decay(args.out, args.head_dim, args.base, args.max_distance))
    return 0


def run_attention(args: argparse.Namespace) -> int:
    from scratchlm.viz.attention_maps import attention_probs, plot_attention

    model, tok = _load(args.checkpoint)
    ids = _prompt_ids(tok, args.prompt, model.config.max_seq_len)
    if args.layer is not None and not 0 <= args.layer < model.config.n_layers:
        raise ValueError(f"--layer {args.layer} is out of range; the model has layers 0..{model.config.n_layers - 1}")
    probs = attention_probs(model, ids)
    print(plot_attention(probs, [_token_label(tok, i) for i in ids[0].tolist()], args.out, args.layer))
    return 0


def run_loss(args: argparse.Namespace) -> int:
    from scratchlm.train.run_metrics import MetricsLog, plot_loss_curve

    if not Path(args.metrics).exists():
        raise FileNotFoundError(f"metrics file {args.metrics} does not exist (training writes DIR/metrics.jsonl)")
    records = MetricsLog(args.metrics).read()
    if not records:
        raise ValueError(f"metrics file {args.metrics} has no complete records to plot")
    print(plot_loss_curve(records, args.out, title=Path(args.metrics).parent.name))
    return 0


def run_sampling(args: argparse.Namespace) -> int:
    from scratchlm.generate.sampling import SamplingParams
    from scratchlm.viz.sampling_dist import filtered_distributions, plot_distributions

    SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p)  # validates
    if args.temperature <= 0:
        raise ValueError("--temperature must be > 0 to draw a distribution (0 means greedy)")
    model, tok = _load(args.checkpoint)
    ids = _prompt_ids(tok, args.prompt, model.config.max_seq_len)
    with torch.no_grad():
        logits = model(ids)[0, -1]  # (V,)
    dists = filtered_distributions(logits, args.temperature, args.top_k, args.top_p, args.min_p)
    labels = [_token_label(tok, i) for i in range(logits.shape[0])]
    print(plot_distributions(dists, labels, args.out, args.n_show))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("viz", help="PNG plots: rope-decay, attention, loss, sampling")
    vsub = p.add_subparsers(dest="plot", metavar="PLOT", required=True)
    r = vsub.add_parser("rope-decay", help="RoPE long-term decay of the relative upper bound (RoFormer fig. 2)")
    r.add_argument("--head-dim", type=int, default=128)
    r.add_argument("--base", type=float, default=10000.0)
    r.add_argument("--max-distance", type=int, default=256)
    add_output_arg(r, "--out", kind="file", default="rope_decay.png", help="PNG to write (new unless --overwrite)")
    r.set_defaults(func=run_rope)
    a = vsub.add_parser("attention", help="attention heat-maps of a trained model for a prompt")
    a.add_argument("--checkpoint", required=True, metavar="DIR")
    a.add_argument("--prompt", required=True)
    a.add_argument("--layer", type=int, default=None, help="one layer only (default: all)")
    add_output_arg(a, "--out", kind="file", default="attention.png", help="PNG to write (new unless --overwrite)")
    a.set_defaults(func=run_attention)
    lo = vsub.add_parser("loss", help="loss curves from a training metrics JSONL file")
    lo.add_argument("--metrics", required=True, metavar="FILE")
    add_output_arg(lo, "--out", kind="file", default="loss.png", help="PNG to write (new unless --overwrite)")
    lo.set_defaults(func=run_loss)
    s = vsub.add_parser("sampling", help="next-token distribution before/after top-k, top-p, min-p")
    s.add_argument("--checkpoint", required=True, metavar="DIR")
    s.add_argument("--prompt", required=True)
    s.add_argument("--temperature", type=float, default=1.0)
    s.add_argument("--top-k", type=int, default=10)
    s.add_argument("--top-p", type=float, default=0.9)
    s.add_argument("--min-p", type=float, default=0.05)
    s.add_argument("--n-show", type=int, default=20)
    add_output_arg(s, "--out", kind="file", default="sampling.png", help="PNG to write (new unless --overwrite)")
    s.set_defaults(func=run_sampling)
