"""Foreign model formats: Hugging Face directories (interop/hf/) and GGUF files (interop/gguf/).

    hf/     config.json <-> ModelConfig (families as table rows), state-dict names, safetensors shards,
            save_pretrained, PEFT adapters, tokenizer files
    gguf/   reading (metadata, tensors, ggml blocks), metadata -> config, tensor names, tokenizer
            metadata -> tokenizer.json, writing
    model_build.py   a TransformerLM holding given tensors (shared by both loaders)
Loading a model by path goes through scratchlm.load (the one place that tells the kinds apart).
"""
