"""`scratchlm train`: pretrain a model from a JSON config or a preset, with --key=value overrides.

    scratchlm train --preset smoke --train_data=data/train.bin --out_dir=runs/smoke
    scratchlm train --config run.json --lr=3e-4 --model.n_layers=6
    scratchlm train --resume --out_dir=runs/smoke          # reads runs/smoke/train_config.json
    torchrun --nproc_per_node=2 -m scratchlm.cli.main train --config run.json   # DDP
"""

from __future__ import annotations

import argparse
from pathlib import Path

from scratchlm.cli.outputs import add_overwrite_arg
from scratchlm.train.train_config import TrainConfig, parse_cli_overrides
from scratchlm.train.loop import train
from scratchlm.train.presets import TRAIN_PRESETS, get_train_preset


def build_config(config: str | None, preset: str | None, overrides: list[str], resume: bool) -> TrainConfig:
    """--config FILE or --preset NAME (or, with --resume, OUT/train_config.json), then the overrides."""
    if config and preset:
        raise ValueError("pass either --config FILE or --preset NAME, not both")
    values = parse_cli_overrides(overrides)
    if config:
        base = TrainConfig.from_json(config)
    elif preset:
        base = get_train_preset(preset)
    elif resume and "out_dir" in values:
        saved = Path(values["out_dir"]) / "train_config.json"
        if not saved.exists():
            raise FileNotFoundError(f"--resume: {saved} does not exist; pass --config or --preset as well")
        base = TrainConfig.from_json(saved)
    else:
        raise ValueError(f"pass --config FILE or --preset NAME (presets: {sorted(TRAIN_PRESETS)}), "
                         "or --resume --out_dir=DIR")
    return base.with_overrides(values)


def run_train(args: argparse.Namespace) -> int:
    cfg = build_config(args.config, args.preset, args.overrides, args.resume)
    result = train(cfg, resume=args.resume, overwrite=args.overwrite)
    if result.checkpoint is not None:
        val = f"{result.val_loss:.4f}" if result.val_loss is not None else "n/a"
        print(f"step {result.step}: val loss {val}; checkpoint {result.checkpoint}; "
              f"metrics {result.metrics_path}; plot {result.out_dir / 'loss.png'}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train", help="pretrain a model (JSON config or preset, --key=value overrides, --resume)", allow_abbrev=False,
        description="Pretrain a model. Any TrainConfig field can be overridden as --key=value "
                    "(model fields as --model.FIELD=value; booleans: true/false). A fresh run needs a new or empty "
                    "out_dir unless --overwrite; --keep_last=K keeps K checkpoints; --spike_factor=F stops a run "
                    "whose loss exceeds F x its running average (0 = off); --weight_growth_factor=G never saves weights "
                    "grown more than G x the last saved ones (default 100; 0 = off).",
    )
    p.add_argument("--config", help="JSON file of TrainConfig fields")
    p.add_argument("--preset", help=f"training preset: {', '.join(sorted(TRAIN_PRESETS))}")
    p.add_argument("--resume", action="store_true",
                   help="continue from OUT_DIR/checkpoint: bit-identical to an uninterrupted run on CPU with the same "
                        "torch thread count, device, dtype and torch version; a larger --max_steps extends the "
                        "schedule (said on stderr)")
    add_overwrite_arg(p, help="replace what out_dir holds (moved aside, deleted once the new run succeeds); "
                             "default: a fresh run refuses a non-empty out_dir")
    p.set_defaults(func=run_train, accepts_overrides=True)
