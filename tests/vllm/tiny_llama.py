"""The tiny Llama shape the scripts run inside vLLM load (dummy weights, no tokenizer): two
layers, small enough for vLLM's CPU build to start in seconds."""

from __future__ import annotations

import json
from pathlib import Path

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_hidden_layers": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}


def tiny_llama(folder: Path) -> Path:
    """``folder`` made, with the model's ``config.json`` in it."""
    folder.mkdir()
    folder.joinpath("config.json").write_text(json.dumps(TINY_LLAMA))
    return folder
