"""Loading a model by path: THE one place that turns a path into model + tokenizer + chat template + stop
ids + sampling defaults (+ a PEFT adapter merged in).

    from scratchlm.load import load_pretrained
    loaded = load_pretrained("SmolLM2-135M-Instruct.Q4_1.gguf")   # or an HF dir, a scratchlm dir, an adapter dir

    kinds.py               what a path is (the only module that looks: GGUF magic, config.json, adapter files)
    model_loader.py        load_pretrained / from_pretrained: dispatch on the kind to interop/ and model_files
    loaded_model.py        LoadedModel (+ its one-line summary)
    tokenizers.py          the tokenizer of a model dir or a GGUF file, with template and special tokens
    generation_config.py   stop ids, sampling defaults, tokenizer_config / generation_config beside the weights
"""

from scratchlm.load.generation_config import write_model_extras
from scratchlm.load.kinds import MODEL_KINDS, model_kind
from scratchlm.load.loaded_model import LoadedModel
from scratchlm.load.model_loader import from_pretrained, load_pretrained

__all__ = ["LoadedModel", "MODEL_KINDS", "from_pretrained", "load_pretrained", "model_kind", "write_model_extras"]
