"""Training-step throughput: scratchlm vs an HF transformers LlamaForCausalLM of the same shape.

Shape (the llama-small preset): vocab 8192, 6 layers, D 384, 6 heads / 2 KV heads, d_ff 1024, tied
embeddings; batch 8 x 256 tokens. One step = forward, cross entropy, backward, AdamW, zero_grad. Both
sides use torch's fused AdamW and SDPA attention; ours trains as the presets do: ops_impl="fused" (fused
norm/SiLU/RoPE, fp32 products through oneDNN) and loss_impl="chunked" (the LM head fused with the loss over
chunks of positions, train/chunked_ce.py); `--ours-ref` uses our from-scratch attention, ops, loss and AdamW
instead; bf16 = torch.autocast on both. Steps of the two are interleaved so
machine load hits both alike; tok/s from the median step time. MFU = training FLOPs of a step
(scratchlm.model_stats, attention included) / its time / the matmul peak of that dtype (1536^3, best of
0.25 s) measured right after it, median over steps; `mfu_vs_max_peak` uses the best peak of the run.
`mfu_of_measured_peak` = `mfu` (the issue's name for it).
--peer nanogpt: the peer is nanoGPT's GPT (benchmarks/peers/nanogpt_model.py, vendored unmodified) and ours the
same GPT-2 architecture at the same dims (LayerNorm with bias, exact GELU MLP, learned positions, tied
embeddings; vocab 8192, 6 layers, D 384, 6 heads, d_ff 1536), nanoGPT with F.cross_entropy, both fused AdamW;
--hf-compile then compiles nanoGPT's forward + loss too (nanoGPT trains with compile=True by default).
Ours keeps freed memory in the process as our trainers do (train/host_memory.py; SCRATCHLM_KEEP_HOST_MEMORY=0
turns it off); the peer steps in a child process with glibc's defaults, as it ships, the two still alternating
step by step (the parent waits idle while the child steps). --peer-process same runs the peer in this process,
under our memory settings too (measured: +20% for HF eager, +3% compiled).
Prints one JSON object.   python benchmarks/train_step.py [--steps 6] [--compile] [--dtypes fp32,bf16]
                          [--peer hf|nanogpt] [--hf-compile]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quiet import wait_quiet  # noqa: E402

from scratchlm.config import get_preset
from scratchlm.interop.hf.config_json import config_to_hf
from scratchlm.kernels.build import native
from scratchlm.interop.hf.state_dict import state_to_hf
from scratchlm.model import TransformerLM
from scratchlm.model_stats import model_stats
from scratchlm.train.lm_loss import model_cross_entropy
from scratchlm.train.losses import cross_entropy
from scratchlm.train.host_memory import keep_host_memory
from scratchlm.train.run_metrics import measure_matmul_peak_gflops
from scratchlm.train.optim import build_optimizer

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def hf_twin(model: TransformerLM) -> LlamaForCausalLM:
    hf_cfg = {k: v for k, v in config_to_hf(model.config, "llama").items() if not k.startswith("_scratchlm")}
    hf = LlamaForCausalLM(LlamaConfig(**hf_cfg, attn_implementation="sdpa"))
    hf.load_state_dict(state_to_hf(model.state_dict(), model.config, "llama"), strict=False)
    return hf.train()


def make_step(model, loss_fn, opt, dtype: str, compile_: bool = False):
    """One training step; compile_ compiles forward + loss as one graph (what `compile=true` trains with).
    model None: loss_fn(x, y) runs the forward itself (the fused head + loss)."""
    def forward_loss(x, y):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            return loss_fn(model(x), y) if model is not None else loss_fn(x, y)

    if compile_:
        native()  # load the kernels before tracing: the compiled fast paths read what native() found
    fwd = torch.compile(forward_loss) if compile_ else forward_loss

    def step(x, y):
        loss = fwd(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss
    return step


def nanogpt_pair(args) -> tuple[TransformerLM, torch.nn.Module]:
    """Our GPT-2-architecture model and nanoGPT's GPT at the benchmark dims."""
    from peers.nanogpt_model import GPT, GPTConfig

    ref = args.ours_ref
    ours = TransformerLM(get_preset("gpt2-small", vocab_size=8192, d_model=384, n_layers=6, n_heads=6, n_kv_heads=6,
                                    head_dim=64, d_ff=1536, max_seq_len=args.seq_len, activation="gelu",
                                    attn_impl="reference" if ref else args.attn, ops_impl="reference" if ref else "fused"))
    peer = GPT(GPTConfig(block_size=args.seq_len, vocab_size=8192, n_layer=6, n_head=6, n_embd=384, dropout=0.0,
                         bias=True)).train()
    return ours, peer


def build_steps(dtype: str, args):
    """(our step, the peer's step, our model) at the benchmark shape, the peer holding our initial weights."""
    torch.manual_seed(0)
    impl = "reference" if args.ours_ref else "torch"
    if args.peer == "nanogpt":
        ours, peer = nanogpt_pair(args)
        # nanoGPT's own training call: model(x, y) -> (logits, loss), its cross entropy inside the forward
        peer_forward, peer_loss = (lambda ids: ids), (lambda ids, t: peer(ids, t)[1])  # noqa: E731
    else:
        ours = TransformerLM(get_preset("llama-small", max_seq_len=args.seq_len,
                                        attn_impl="reference" if args.ours_ref else args.attn,
                                        ops_impl="reference" if args.ours_ref else "fused"))
        peer = hf_twin(ours)
        peer_forward = lambda ids: peer(input_ids=ids).logits  # noqa: E731
        peer_loss = lambda lg, t: F.cross_entropy(lg.float().flatten(0, 1), t.flatten())  # noqa: E731
    if args.ours_ref:
        ours_model, ours_loss = ours, (lambda lg, t: cross_entropy(lg, t, impl=impl))  # noqa: E731
    else:  # loss_impl="chunked", as the training presets run
        ours_model, ours_loss = None, (lambda ids, t: model_cross_entropy(ours, ids, t, impl="chunked"))  # noqa: E731
    ours_step = make_step(ours_model, ours_loss, build_optimizer(ours, 1e-4, 0.1, impl=impl), dtype, args.compile)
    peer_step = make_step(peer_forward, peer_loss,
                          torch.optim.AdamW(peer.parameters(), lr=1e-4, weight_decay=0.1, fused=True), dtype,
                          args.hf_compile)
    return ours_step, peer_step, ours


def timed(fn, *a) -> float:
    t0 = time.perf_counter()
    fn(*a)
    return time.perf_counter() - t0


class PeerProcess:
    """The peer's steps in a child process that runs as the peer ships (glibc's default malloc settings); the
    parent asks for one step at a time and waits (idle) for its time, so the two still alternate step by step."""

    def __init__(self, dtype: str) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--peer-child", dtype],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def step(self) -> float:
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        while True:  # the peer may print its own lines (nanoGPT prints its parameter count)
            line = self.proc.stdout.readline()
            if not line:
                raise SystemExit(f"the peer process exited (code {self.proc.wait()})")
            if line.startswith("step_s "):
                return float(line.split()[1])

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def peer_child(dtype: str, args, x, y) -> None:
    """--peer-child: build the pair, then one peer step per "step" line on stdin, its seconds on stdout."""
    _, peer_step, _ = build_steps(dtype, args)
    for _ in sys.stdin:
        print("step_s", timed(peer_step, x, y), flush=True)


def run_dtype(dtype: str, args, x, y) -> dict:
    ours_step, peer_step, ours = build_steps(dtype, args)
    peer = PeerProcess(dtype) if args.peer_process == "separate" else None
    peer_time = peer.step if peer else (lambda: timed(peer_step, x, y))  # noqa: E731
    times: dict[str, list[float]] = {"ours": [], "hf": []}
    peaks: list[float] = []
    quiet: dict = {}
    for i in range(args.warmup + args.steps):
        if i == args.warmup and args.quiet_timeout > 0:  # the child process is idle, waiting for its next step
            quiet["others_load_cores"] = wait_quiet(timeout_s=args.quiet_timeout)
        t_ours, t_peer = timed(ours_step, x, y), peer_time()
        if i >= args.warmup:
            times["ours"].append(t_ours)
            times["hf"].append(t_peer)
            # the matmul peak right now: this VM's speed drifts by +-30% within minutes
            peaks.append(measure_matmul_peak_gflops(DTYPES[dtype], n=1536, seconds=0.25))
    if peer:
        peer.close()
    tokens = x.numel()
    flops = model_stats(ours, ours.config, args.seq_len).flops_per_token_train
    tok_s = tokens / statistics.median(times["ours"])
    hf_tok_s = tokens / statistics.median(times["hf"])
    # MFU per step against the peak measured right after it, then the median (robust to the drift)
    mfus = [tokens * flops / t / (p * 1e9) for t, p in zip(times["ours"], peaks)]
    hf_mfus = [tokens * flops / t / (p * 1e9) for t, p in zip(times["hf"], peaks)]
    return {"dtype": dtype, "tok_s": round(tok_s, 1), "hf_tok_s": round(hf_tok_s, 1), "ratio": round(tok_s / hf_tok_s, 3),
            "gflop_s": round(tok_s * flops / 1e9, 1), "hf_gflop_s": round(hf_tok_s * flops / 1e9, 1),
            "peak_gflops": round(statistics.median(peaks), 1), "peak_gflops_max": round(max(peaks), 1),
            "mfu": round(statistics.median(mfus), 4), "hf_mfu": round(statistics.median(hf_mfus), 4),
            "mfu_of_measured_peak": round(statistics.median(mfus), 4),
            "mfu_vs_max_peak": round(tok_s * flops / (max(peaks) * 1e9), 4), **quiet}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--compile", action="store_true", help="torch.compile our forward + loss (as compile=true trains)")
    ap.add_argument("--hf-compile", action="store_true", help="also torch.compile HF's forward + loss (peer check)")
    ap.add_argument("--attn", choices=["sdpa", "reference"], default="sdpa",
                    help="our attention: torch's SDPA, or our math (under --compile inductor fuses it)")
    ap.add_argument("--ours-ref", action="store_true", help="our from-scratch attention, loss and AdamW")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--peer", choices=["hf", "nanogpt"], default="hf",
                    help="hf: LlamaForCausalLM at llama-small; nanogpt: nanoGPT's GPT vs our GPT-2 architecture "
                         "(the hf_* fields then hold the peer's numbers)")
    ap.add_argument("--peer-process", choices=["separate", "same"], default="separate",
                    help="separate: the peer steps in a child process with the default malloc settings, as it "
                         "ships; same: in this process, sharing the memory settings our trainers make")
    ap.add_argument("--quiet-timeout", type=float, default=300.0,
                    help="wait up to this long for a quiet machine before the timed steps (0: don't wait)")
    ap.add_argument("--peer-child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 8192, (args.batch_size, args.seq_len + 1), generator=g)
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    if args.peer_child:
        return peer_child(args.peer_child, args, x, y)
    host_memory_kept = keep_host_memory()  # as our trainers start (train/host_memory.py)
    results = [run_dtype(d, args, x, y) for d in args.dtypes.split(",")]
    shape = ("llama-small vocab 8192 L6 D384 H6/2 d_ff 1024" if args.peer == "hf"
             else "gpt2 vocab 8192 L6 D384 H6 d_ff 1536 (nanoGPT's GPT, bias=True)")
    print(json.dumps({"benchmark": "train_step", "peer": args.peer, "shape": shape,
                      "batch": [args.batch_size, args.seq_len], "threads": torch.get_num_threads(),
                      "compile": args.compile, "hf_compile": args.hf_compile, "attn": args.attn, "ours_reference_path": args.ours_ref,
                      "host_memory_kept": host_memory_kept, "peer_process": args.peer_process,
                      "results": results}))


if __name__ == "__main__":
    main()
