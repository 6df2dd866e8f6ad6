"""The pretraining loop: accumulate, clip, step, log, evaluate, checkpoint; DDP/FSDP under torchrun.

One optimizer step s (0-based):
    lr_s = schedule(s);  for each micro-batch m: loss_m = CE(model(x_m), y_m) / A;  backward
    (MoE models add moe_aux_loss_coef * the load-balancing loss to CE, train/moe_loss.py)
    n = ||g|| (clipped to grad_clip);  the divergence guard (train/guard.py) stops the run if the loss or
    n is inf/NaN or the loss spikes (nothing saved after the last good checkpoint);  AdamW step with lr_s
Before every checkpoint the guard also checks the weights to save (finite, not grown more than
weight_growth_factor x since the last saved ones, probe loss not spiking); the previous checkpoint is
replaced only when they pass.
Everything a step depends on (lr, data windows, the guard's running average) is a function of s and the
checkpointed state, and the torch, Python and numpy RNGs are seeded from `seed` and checkpointed, so
N steps + resume + M steps gives bit-identical losses and weights to N + M steps on CPU with the same
number of torch threads (tested with 1 and 2; the embedding's backward is deterministic, see nn/embedding.py).
"""

from __future__ import annotations

import contextlib
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from scratchlm.config import get_preset
from scratchlm.io_utils import atomic_write_text, claim_run_dir, release_replaced
from scratchlm.kernels.build import native
from scratchlm.model import TransformerLM
from scratchlm.model_stats import model_stats
from scratchlm.train import distributed as D
from scratchlm.train.checkpoint import (
    TrainerState, find_checkpoint, index_keyed, load_checkpoint, read_state_json, save_checkpoint,
)
from scratchlm.train.clip import clip_grad_norm, global_grad_norm
from scratchlm.train.train_config import TrainConfig
from scratchlm.train.data_source import DataSource, to_device
from scratchlm.train.host_memory import keep_host_memory
from scratchlm.train.guard import DivergenceGuard, LastGood, TrainingDiverged, WeightStats
from scratchlm.train.lm_loss import fused_head_weight, model_cross_entropy
from scratchlm.train.losses import cross_entropy, perplexity
from scratchlm.train.run_metrics import MetricsLog, PeakTracker, plot_loss_curve
from scratchlm.train.moe_loss import load_balancing_loss
from scratchlm.train.optim import build_optimizer
from scratchlm.train.precision import autocast
from scratchlm.train.progress import TrainProgress
from scratchlm.train.resume import resumed_total_steps, schedule_lr
from scratchlm.train.out_dir import check_fresh_out_dir

__all__ = ["TrainResult", "Trainer", "TrainingDiverged", "build_model", "train"]


@dataclass
class TrainResult:
    out_dir: Path
    checkpoint: Path | None
    step: int
    last_loss: float | None
    val_loss: float | None
    metrics_path: Path


def build_model(cfg: TrainConfig, data_vocab: int) -> TransformerLM:
    """The preset + overrides; vocab_size defaults to the token file's and must cover it."""
    overrides = {"vocab_size": data_vocab, **cfg.model}
    config = get_preset(cfg.model_preset, **overrides)
    if config.vocab_size < data_vocab:
        raise ValueError(f"model vocab_size={config.vocab_size} is smaller than the token file's vocab_size="
                         f"{data_vocab}; drop the model.vocab_size override or raise it")
    if cfg.seq_len > config.max_seq_len:
        raise ValueError(f"seq_len={cfg.seq_len} exceeds the model's max_seq_len={config.max_seq_len}; "
                         f"lower seq_len or set --model.max_seq_len={cfg.seq_len}")
    return TransformerLM(config)


class Trainer:
    """Holds the model, optimizer, data and state of one run; `run()` trains to the end."""

    def __init__(self, cfg: TrainConfig, resume: bool = False, overwrite: bool = False, claimed: bool = False) -> None:
        """resume: continue OUT/checkpoint; overwrite: replace what out_dir holds (moved aside, deleted when
        the run succeeds); claimed: the caller (quickstart) already made out_dir this run's own."""
        if resume and overwrite:
            raise ValueError("--resume continues the run in out_dir and --overwrite replaces it; pass only one")
        self.cfg, self.overwrite, self.claimed, self.replaced = cfg, overwrite, claimed, None
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        keep_host_memory()  # the step's activations stay in the heap between steps (train/host_memory.py)
        self.out = Path(cfg.out_dir)
        if not resume and not claimed:  # a bad out_dir fails before any data or model is loaded
            check_fresh_out_dir(cfg, overwrite)
        self.info = D.init_distributed(cfg.device)
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        self.data = DataSource(cfg.train_data, cfg.val_data, cfg.val_fraction, cfg.seq_len, cfg.sampler, cfg.seed)
        self.raw_model = build_model(cfg, self.data.vocab_size).to(self.info.device)
        self.raw_model.activation_checkpointing = cfg.activation_checkpointing
        self.model = D.wrap_model(self.raw_model, self.info, cfg.fsdp)  # FSDP swaps in sharded parameters
        self.optimizer = build_optimizer(self.raw_model, cfg.lr, cfg.weight_decay, (cfg.beta1, cfg.beta2), cfg.eps,
                                         cfg.optimizer_impl)
        self.metrics = MetricsLog(self.out / "metrics.jsonl", enabled=self.info.is_main)
        dtype = torch.bfloat16 if cfg.precision == "bf16-mixed" else torch.float32
        self.peak = PeakTracker(cfg.peak_gflops, dtype, self.info.device)  # private RNG: before and after restore
        self.state = self._start_or_resume(resume)
        self.guard = DivergenceGuard(cfg.spike_factor, self.state.loss_ema, self.state.loss_ema_steps,
                                     cfg.weight_growth_factor)
        self.saved_weights = self._weight_stats()  # the resumed checkpoint's, or the initial weights
        self._last_batch: tuple[torch.Tensor, torch.Tensor] | None = None
        # compile=true compiles forward *and* loss as one graph: inductor fuses the (B*T, V) log-softmax
        # with the LM head's output instead of materialising fp32 logits (1.6x faster than compiling the
        # model alone in benchmarks/train_step.py)
        if cfg.compile:
            native()  # the fast paths read what it finds while compiled: load (or build) the kernels eagerly first
        self._train_loss = torch.compile(self._training_loss) if cfg.compile else self._training_loss
        self.tokens_per_step = self.info.world_size * cfg.grad_accum * cfg.batch_size * cfg.seq_len
        self.flops_per_token = model_stats(self.raw_model, self.raw_model.config, cfg.seq_len).flops_per_token_train

    def _start_or_resume(self, resume: bool) -> TrainerState:
        if resume:
            return self._resume()
        if not self.claimed:
            D.barrier(self.info)
            if self.info.is_main:  # the previous contents (--overwrite) are moved aside, deleted on success
                self.replaced = claim_run_dir(self.out, self.overwrite, "out_dir")
            D.barrier(self.info)
        if self.info.is_main:
            self.metrics.truncate_after(-1)
            atomic_write_text(self.out / "train_config.json", json.dumps(self.cfg.to_dict(), indent=2) + "\n")
        return TrainerState(total_steps=self.cfg.max_steps)

    def _resume(self) -> TrainerState:
        """Load OUT/checkpoint; a changed schedule is extended as train/resume.py says (note on stderr)."""
        ckpt = find_checkpoint(self.out)
        if ckpt is None:
            raise FileNotFoundError(f"--resume: no checkpoint in {self.out}/checkpoint; start without --resume")
        saved = read_state_json(ckpt)["train_config"]
        sharded = self.model if self.cfg.fsdp and self.info.enabled else None
        state = load_checkpoint(ckpt, self.raw_model, self.optimizer, sharded)
        state.total_steps, note = resumed_total_steps(saved, self.cfg, state.step, state.total_steps, str(ckpt))
        if self.info.is_main:
            if note:
                print(note, file=sys.stderr)
            elif state.step >= min(self.cfg.stop_at_step or state.total_steps, state.total_steps):
                print(f"resume: {ckpt} is already at step {state.step} of {state.total_steps}; nothing to train "
                      f"(pass --max_steps greater than {state.step} to extend the run)", file=sys.stderr)
        self.data.restore(state.data_position)
        self.metrics.truncate_after(state.step)
        return state

    def lr(self, step: int) -> float:
        return schedule_lr(self.cfg, step, self.state.total_steps)

    def _autocast(self):
        return autocast(self.cfg.precision, self.info.device)

    def _chunked(self, reduction: str) -> bool:
        """loss_impl="chunked" where it applies: a fusable head (train/lm_loss.py), a reduced loss, and not under
        FSDP (the head's weight is sharded outside its forward); elsewhere it computes as "torch"."""
        return (self.cfg.loss_impl == "chunked" and reduction != "none" and fused_head_weight(self.raw_model) is not None
                and not (self.cfg.fsdp and self.info.enabled))

    def _loss(self, x: torch.Tensor, y: torch.Tensor, model=None, reduction: str = "mean",
              router: bool = False) -> torch.Tensor | tuple[torch.Tensor, tuple]:
        """Cross entropy of y under the model (B, T) -> scalar (and the MoE router logits when `router`)."""
        cfg, model = self.cfg, model or self.model
        with self._autocast():
            if self._chunked(reduction):  # the head fused with the loss (train/chunked_ce.py)
                return model_cross_entropy(model, x, y, "chunked", cfg.label_smoothing, cfg.z_loss, reduction,
                                           return_router_logits=router, raw_model=self.raw_model)
            out = model(x, return_router_logits=True) if router else model(x)  # logits (B, T, V)
        logits, router_logits = out if router else (out, None)
        impl = "torch" if cfg.loss_impl == "chunked" else cfg.loss_impl
        loss = cross_entropy(logits, y, label_smoothing=cfg.label_smoothing, z_loss=cfg.z_loss, reduction=reduction,
                             impl=impl)
        return (loss, router_logits) if router else loss

    def _training_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The optimised loss: cross entropy, plus moe_aux_loss_coef * the load-balancing loss for MoE models."""
        config = self.raw_model.config
        if config.moe_num_experts == 0 or config.moe_aux_loss_coef == 0:
            return self._loss(x, y)
        ce, router_logits = self._loss(x, y, router=True)  # router logits per MoE layer (B T, E)
        return ce + config.moe_aux_loss_coef * load_balancing_loss(router_logits, config.moe_top_k)

    def train_step(self, step: int) -> tuple[float, float, float]:
        """One optimizer step; returns (mean loss over ranks, grad norm, lr)."""
        cfg, lr = self.cfg, self.lr(step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        total = torch.zeros((), device=self.info.device)
        batches = list(self.data.step_batches(step, cfg.batch_size, cfg.grad_accum, self.info.rank,
                                              self.info.world_size))
        self._last_batch = batches[0]  # the divergence guard's probe before a save
        for m, batch in enumerate(batches):
            x, y = to_device(batch, self.info.device)
            sync = m == len(batches) - 1 or not hasattr(self.model, "no_sync")
            with contextlib.nullcontext() if sync else self.model.no_sync():
                loss = self._train_loss(x, y) / cfg.grad_accum
                loss.backward()
            total += loss.detach()
        params = list(self.raw_model.parameters())
        norm = clip_grad_norm(params, cfg.grad_clip) if cfg.grad_clip > 0 else global_grad_norm(params)
        loss_value = float(D.all_reduce_mean(total, self.info))
        try:
            self.guard.check_step(step, loss_value, float(norm), lr, self._last_checkpoint)
        except TrainingDiverged:
            self.optimizer.zero_grad(set_to_none=True)
            raise
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss_value, float(norm), lr

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean val loss per token over the fixed eval windows (summed over ranks)."""
        self.model.eval()
        sums = torch.zeros(2, device=self.info.device)
        model = self.model if self.cfg.fsdp else self.raw_model
        for batch in self.data.eval_batches(self.cfg.eval_batches, self.cfg.batch_size, self.info.rank,
                                            self.info.world_size):
            x, y = to_device(batch, self.info.device)
            sums[0] += self._loss(x, y, model=model, reduction="sum").float()
            sums[1] += y.numel()
        self.model.train()
        sums = D.all_reduce_mean(sums, self.info)
        return float(sums[0] / sums[1])

    @torch.no_grad()
    def _probe_loss(self) -> float:
        """Loss of the current weights on the last step's first micro-batch (each rank its own; averaged):
        the data the last update was computed on, so a blow-up by that update shows there first."""
        model = self.model if self.cfg.fsdp else self.raw_model
        batch = self._last_batch if self._last_batch is not None else self.data.probe_batch(self.cfg.batch_size)
        x, y = to_device(batch, self.info.device)
        return float(D.all_reduce_mean(self._loss(x, y, model=model).float(), self.info))

    def _weights_finite(self) -> bool:
        local = [p.to_local() if hasattr(p, "to_local") else p for p in self.raw_model.parameters()]  # FSDP shards
        ok = torch.stack([p.detach().isfinite().all() for p in local]).all().float()
        return bool(D.all_reduce_mean(ok, self.info) == 1)

    @torch.no_grad()
    def _weight_stats(self) -> WeightStats:
        """L2 norm (fp64 sum of squares) and max |w| over all parameters (FSDP: over every rank's shards)."""
        local = [p.to_local() if hasattr(p, "to_local") else p for p in self.raw_model.parameters()]
        local = [p.detach() for p in local if p.numel()]
        sq = torch.stack([p.double().square().sum() for p in local]).sum()
        top = torch.stack([p.abs().max().double() for p in local]).max()
        sharded = self.cfg.fsdp and self.info.enabled
        sq = D.all_reduce_mean(sq, self.info) * (self.info.world_size if sharded else 1)
        return WeightStats(float(sq.sqrt()), float(D.all_reduce_max(top, self.info)), self.state.step)

    def _last_checkpoint(self) -> LastGood:
        ckpt = find_checkpoint(self.out)
        if ckpt is None:
            return LastGood(None)
        return LastGood(str(ckpt), read_state_json(ckpt)["trainer"]["step"])

    def save(self) -> Path:
        """Checkpoint on rank 0 (FSDP: every rank takes part in gathering the full weights), after the
        divergence guard passed the weights (train/guard.py); the previous checkpoint is replaced only then."""
        weights = self._weight_stats()
        self.guard.check_before_save(self.state.step, self._weights_finite(), self._probe_loss(),
                                     self._last_checkpoint, weights, self.saved_weights)
        self.state.loss_ema, self.state.loss_ema_steps = self.guard.ema, self.guard.n
        self.state.data_position = self.data.position()
        model = self._full_model()
        optimizer_state = self._full_optimizer_state()
        if self.info.is_main:
            save_checkpoint(self.out, model, optimizer_state, self.state, self.cfg.to_dict(),
                            self.cfg.tokenizer_dir or None, keep_last=self.cfg.keep_last)
        D.barrier(self.info)
        self.saved_weights = weights
        return self.out / "checkpoint"

    def _full_model(self) -> TransformerLM | None:
        """The unsharded model: itself, or under FSDP a CPU copy gathered on rank 0 (None elsewhere)."""
        if not self.cfg.fsdp or not self.info.enabled:
            return self.raw_model
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not self.info.is_main:
            return None
        copy = TransformerLM(self.raw_model.config)
        copy.load_state_dict(full)
        return copy

    def _full_optimizer_state(self) -> dict | None:
        """optimizer.state_dict(); under FSDP the sharded moments gathered on rank 0 (None elsewhere)."""
        if not self.cfg.fsdp or not self.info.enabled:
            return self.optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        full = get_optimizer_state_dict(self.model, self.optimizer,
                                        options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return index_keyed(full) if self.info.is_main else None

    def _fix_budget(self, steps_done: int, seconds: float) -> None:
        """With max_time_s, size the schedule from the measured step time (evals and checkpoints included):
        first after 25 steps, then refined once a fifth of the way in (early steps run slower, which
        left ~25% of the budget unused); total_steps is checkpointed, so a resume keeps it."""
        per_step = float(D.all_reduce_mean(torch.tensor(seconds / steps_done, device=self.info.device), self.info))
        est = int(self.cfg.max_time_s * 0.95 / per_step)
        self.state.total_steps = max(self.state.step + 1, min(self.cfg.max_steps, est))

    def _should_stop_for_time(self, t0: float) -> bool:
        if not self.cfg.max_time_s:
            return False
        flag = torch.tensor(float(time.perf_counter() - t0 > self.cfg.max_time_s), device=self.info.device)
        return bool(D.all_reduce_mean(flag, self.info) > 0)

    def _log(self, step: int, loss: float, norm: float, lr: float, tok_s: float, elapsed: float,
             bar: TrainProgress) -> None:
        util = self.peak.mfu(tok_s, self.flops_per_token)
        self.metrics.write({"step": step, "loss": loss, "lr": lr, "grad_norm": norm, "tok_s": round(tok_s, 1),
                            "mfu": round(util, 4), "peak_gflops": round(self.peak.peak, 1),
                            "tokens": self.state.tokens_seen, "elapsed_s": round(elapsed, 2)})
        bar.show(loss=f"{loss:.4f}", tok_s=f"{tok_s:,.0f}", mfu=f"{100 * util:.1f}%")

    def _eval_and_log(self, step: int, bar: TrainProgress, elapsed: float) -> None:
        val = self.evaluate()
        self.state.last_val_loss = val
        self.metrics.write({"step": step, "val_loss": val, "val_ppl": perplexity(val), "elapsed_s": round(elapsed, 2)})
        bar.write(f"step {step}: val loss {val:.4f} (ppl {perplexity(val):.2f})")

    def run(self) -> TrainResult:
        """Train from state.step to total_steps (or stop_at_step / max_time_s); checkpoint and plot."""
        cfg = self.cfg
        stop = cfg.stop_at_step or self.state.total_steps
        budget_fixed = not cfg.max_time_s or self.state.step > 0
        bar = TrainProgress(self.state.total_steps, self.state.step, None if budget_fixed else cfg.max_time_s,
                            cfg.progress and self.info.is_main)
        t0 = t_log = time.perf_counter()
        first, n_log, loss, t5 = self.state.step, 0, None, t0
        refine_at = None
        while self.state.step < min(stop, self.state.total_steps):
            step = self.state.step
            loss, norm, lr = self.train_step(step)
            self.state.step, self.state.tokens_seen = step + 1, self.state.tokens_seen + self.tokens_per_step
            n_log += 1
            done = self.state.step
            if done - first == 5:
                t5 = time.perf_counter()  # step times after the first, slower steps
            if not budget_fixed and (done - first == 25 or done == self.state.total_steps):
                self._fix_budget(max(1, done - first - 5), time.perf_counter() - (t5 if done - first > 5 else t0))
                budget_fixed, refine_at = True, done + max(25, self.state.total_steps // 5)
            elif refine_at is not None and done == refine_at and done < self.state.total_steps:
                self._fix_budget(done - first - 5, time.perf_counter() - t5)
                refine_at = None
            bar.advance(done, self.state.total_steps, time.perf_counter() - t0)
            final = done >= min(stop, self.state.total_steps) or self._should_stop_for_time(t0)
            if done % cfg.log_interval == 0 or final:
                now = time.perf_counter()
                self._log(done, loss, norm, lr, n_log * self.tokens_per_step / (now - t_log), now - t0, bar)
                t_log, n_log = now, 0
            if done % cfg.eval_interval == 0 or final:
                self._eval_and_log(done, bar, time.perf_counter() - t0)
            if done % cfg.ckpt_interval == 0 or final:
                self.save()
            if final:
                break
        bar.close()
        return self._finish(loss)

    def _finish(self, loss: float | None) -> TrainResult:
        ckpt = find_checkpoint(self.out)
        if self.info.is_main and self.metrics.read():
            plot_loss_curve(self.metrics.read(), self.out / "loss.png", title=f"scratchlm {self.out.name}")
        return TrainResult(self.out, ckpt, self.state.step, loss, self.state.last_val_loss, self.metrics.path)


def train(cfg: TrainConfig, resume: bool = False, overwrite: bool = False, claimed: bool = False) -> TrainResult:
    """Run (or resume) the training described by `cfg`; see Trainer."""
    trainer = Trainer(cfg, resume=resume, overwrite=overwrite, claimed=claimed)
    try:
        result = trainer.run()
        release_replaced(trainer.replaced)
        return result
    finally:
        D.shutdown(trainer.info)
