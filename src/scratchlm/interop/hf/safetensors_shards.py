"""Safetensors weights in the HF layout: one `model.safetensors`, or shards plus an index.

Sharded layout (what transformers writes and reads):
    model-00001-of-00003.safetensors, ...,
    model.safetensors.index.json = {"metadata": {"total_size": BYTES}, "weight_map": {tensor_name: shard_file}}
Saving fills shards greedily in name order up to `max_shard_size` bytes (a tensor larger than the
limit gets a shard of its own); one shard is written as plain `model.safetensors` with no index.
Every file is written atomically; stale files from an earlier save in the same layout are removed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save
from tqdm import tqdm

from scratchlm.io_utils import atomic_write, atomic_write_text

SINGLE_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
SHARD_PATTERN = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
METADATA = {"format": "pt"}


def parse_size(size: int | str) -> int:
    """Bytes from an int or a string like "500MB", "2GB", "64KiB"."""
    if isinstance(size, int) and not isinstance(size, bool):
        value = size
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]I?B|B)?\s*", str(size).upper())
        if not m:
            raise ValueError(f"max_shard_size {size!r} is not a size; use bytes or e.g. '500MB', '2GB'")
        value = int(float(m.group(1)) * _UNITS[m.group(2) or "B"])
    if value <= 0:
        raise ValueError(f"max_shard_size must be positive, got {size!r}")
    return value


def plan_shards(state: dict[str, torch.Tensor], max_bytes: int) -> list[list[str]]:
    """Group tensor names (sorted) into shards of at most max_bytes each (oversized tensors alone)."""
    shards: list[list[str]] = [[]]
    used = 0
    for name in sorted(state):
        size = state[name].numel() * state[name].element_size()
        if shards[-1] and used + size > max_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += size
    return shards


def _remove_stale(directory: Path, keep: set[str]) -> None:
    for path in directory.iterdir():
        stale = path.name in (SINGLE_NAME, INDEX_NAME) or SHARD_PATTERN.match(path.name)
        if stale and path.name not in keep:
            path.unlink()


def save_sharded(state: dict[str, torch.Tensor], directory: str | Path, max_shard_size: int | str = "5GB",
                 progress: bool = False) -> list[Path]:
    """Write `state` as HF safetensors (sharded with an index when over max_shard_size); return the files."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    shards = plan_shards(state, parse_size(max_shard_size))
    n = len(shards)
    names = [SINGLE_NAME] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    for file_name, keys in tqdm(list(zip(names, shards)), desc="writing shards", disable=not progress):
        blob = save({k: state[k].contiguous() for k in keys}, metadata=METADATA)
        with atomic_write(directory / file_name) as f:
            f.write(blob)
    written = set(names)
    if n > 1:
        total = sum(t.numel() * t.element_size() for t in state.values())
        index = {"metadata": {"total_size": total},
                 "weight_map": {k: file_name for file_name, keys in zip(names, shards) for k in keys}}
        atomic_write_text(directory / INDEX_NAME, json.dumps(index, indent=2) + "\n")
        written.add(INDEX_NAME)
    _remove_stale(directory, written)
    return [directory / name for name in sorted(written)]


def _read_index(directory: Path) -> dict[str, list[str]]:
    """{shard_file: [tensor names]} from the index (or the single file)."""
    index_path = directory / INDEX_NAME
    if not index_path.exists():
        if not (directory / SINGLE_NAME).exists():
            found = sorted(p.name for p in directory.glob("*.bin")) + sorted(p.name for p in directory.glob("*.pt"))
            hint = f" (found {found}: pickle checkpoints are not loaded; re-save them as safetensors)" if found else ""
            raise FileNotFoundError(f"{directory} has neither {SINGLE_NAME} nor {INDEX_NAME}{hint}")
        return {SINGLE_NAME: []}
    try:
        weight_map = json.loads(index_path.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{index_path} is not a valid safetensors index ({exc!r}); it needs a 'weight_map'") from None
    files: dict[str, list[str]] = {}
    for tensor, file_name in weight_map.items():
        files.setdefault(file_name, []).append(tensor)
    return files


def load_sharded(directory: str | Path, progress: bool = False) -> dict[str, torch.Tensor]:
    """Read every tensor of an HF safetensors checkpoint (single file or index + shards) on CPU."""
    directory = Path(directory)
    state: dict[str, torch.Tensor] = {}
    files = _read_index(directory)
    for file_name, expected in tqdm(sorted(files.items()), desc="reading shards", disable=not progress):
        path = directory / file_name
        if not path.exists():
            raise FileNotFoundError(f"shard {path} listed in {directory / INDEX_NAME} is missing")
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                for key in f.keys():
                    state[key] = f.get_tensor(key)
        except Exception as exc:  # safetensors raises its own error types on corrupt files
            raise ValueError(f"cannot read {path}: {exc} (truncated or not a safetensors file?)") from None
        missing = sorted(set(expected) - set(state))
        if missing:
            raise ValueError(f"{path} lacks tensors the index assigns to it: {missing[:5]}")
    return state
