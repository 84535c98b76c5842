"""A tiny Hugging Face model folder, and mutations of its config.json: a key dropped, a value replaced by one of
another type or out of range (null, 0, negative, NaN, huge, text, a list) — what a bad edit or a broken
exporter leaves. Used by the CI fuzz test and `benchmarks/tools/fuzz_load.py`.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import tokenizers
from safetensors.numpy import save_file
from tokenizers import models

from kerneltriage.engine import names
from kerneltriage.engine.config import ModelConfig
from kerneltriage.engine.validate import expected_shapes

CONFIG = {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
          "intermediate_size": 48, "num_hidden_layers": 2, "vocab_size": 64, "max_position_embeddings": 128,
          "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False, "bos_token_id": 0,
          "eos_token_id": 1, "head_dim": 8}
REPLACEMENTS = (None, 0, -1, 1, 3, 2**31 - 1, 2**63, float("nan"), float("inf"), 1e-300, "30", [4], {}, True,
                "qwen3", "mamba")


def write_tiny_hf_dir(folder: Path, seed: int = 0) -> Path:
    """config.json, model.safetensors (random float32 weights of CONFIG's shapes) and a 5-token tokenizer.json."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(CONFIG))
    rng = np.random.default_rng(seed)
    shapes = expected_shapes(ModelConfig.from_hf(CONFIG))
    save_file({names.from_internal(name, names.HF): (rng.standard_normal(shape) * 0.2).astype(np.float32)
               for name, shape in shapes.items()}, str(folder / "model.safetensors"))
    backend = tokenizers.Tokenizer(models.BPE({"<s>": 0, "</s>": 1, "h": 2, "i": 3, "hi": 4}, [("h", "i")]))
    backend.add_special_tokens(["<s>", "</s>"])
    backend.save(str(folder / "tokenizer.json"))
    return folder


def mutate_config(config: dict, rng: random.Random) -> tuple[dict, str]:
    """One mutation of `config`: a key dropped (a third of the time) or its value replaced."""
    key = rng.choice(sorted(config))
    mutated = dict(config)
    if rng.random() < 1 / 3:
        del mutated[key]
        return mutated, f"config.json: {key} removed"
    value = rng.choice(REPLACEMENTS)
    mutated[key] = value
    return mutated, f"config.json: {key} = {value!r}"


def config_mutants(pristine: Path, into: Path, count: int, seed: int) -> list[tuple[Path, str]]:
    """`count` copies of the folder `pristine`, each with one mutated config.json (randomness from (seed, i))."""
    config = json.loads((pristine / "config.json").read_text())
    out = []
    for index in range(count):
        mutated, what = mutate_config(config, random.Random(f"{seed}:{index}"))
        folder = into / f"hf-{index}"
        shutil.copytree(pristine, folder)
        (folder / "config.json").write_text(json.dumps(mutated))  # NaN and inf are written as JSON allows
        out.append((folder, what))
    return out
