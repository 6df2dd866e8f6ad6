"""scratchlm: the whole decoder-only LLM stack written from scratch in PyTorch.

tokenizer -> data -> model -> train -> generate -> align -> serve. See README.md for the map.
"""

__version__ = "0.1.0"
