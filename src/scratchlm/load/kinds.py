"""What a model path is: the one place that looks at a path and names its kind.

    model_kind("SmolLM2-135M-Instruct.Q4_1.gguf")  -> ("gguf", path)
    model_kind("runs/quickstart/checkpoint")       -> ("scratchlm", path)

Kinds: a file starting with the GGUF magic -> "gguf"; a directory holding a PEFT adapter
(adapter_config.json, no model.safetensors) -> "adapter"; a directory whose config.json has
`model_type`/`architectures` -> "hf"; any other directory with config.json -> "scratchlm"; a directory
holding exactly one .gguf file and no config.json -> that file. Anything else is a one-line error.
"""

from __future__ import annotations

from pathlib import Path

from scratchlm.interop.gguf.reader import is_gguf_file
from scratchlm.interop.hf.model_dir import is_hf_config, read_config_json
from scratchlm.interop.hf.peft_adapter import is_adapter_dir

MODEL_KINDS = ("scratchlm", "hf", "gguf", "adapter")


def model_kind(path: str | Path) -> tuple[str, Path]:
    """("scratchlm" | "hf" | "gguf" | "adapter", resolved path); clear errors for anything else."""
    path = Path(path)
    if path.is_file():
        if is_gguf_file(path):
            return "gguf", path
        raise ValueError(f"{path} is a file but not a GGUF file; pass a model directory (config.json + "
                         "model.safetensors) or a .gguf file")
    if not path.is_dir():
        raise FileNotFoundError(f"model path {path} does not exist (expected a checkpoint directory, an HF model "
                                "directory or a .gguf file)")
    if is_adapter_dir(path):
        return "adapter", path
    if not (path / "config.json").is_file():
        ggufs = sorted(p for p in path.glob("*.gguf") if is_gguf_file(p))
        if len(ggufs) == 1:
            return "gguf", ggufs[0]
        if ggufs:
            raise ValueError(f"{path} holds {len(ggufs)} GGUF files ({', '.join(p.name for p in ggufs)}); name one")
    return ("hf" if is_hf_config(read_config_json(path)) else "scratchlm"), path
