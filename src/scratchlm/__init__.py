"""scratchlm: the whole decoder-only LLM stack written from scratch in PyTorch.

tokenizer -> data -> model -> train -> generate -> align -> serve. See README.md for the map.
"""

__version__ = "0.1.0"

_LAZY = {"from_pretrained": "scratchlm.load", "save_pretrained": "scratchlm.interop.hf.model_dir",
         "load_pretrained": "scratchlm.load"}


def __getattr__(name: str):
    """Lazy top-level API (`scratchlm.from_pretrained`, `scratchlm.save_pretrained`) without import-time cost."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'scratchlm' has no attribute {name!r}")
