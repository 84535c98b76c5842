"""Write a complete tiny model as a GGUF file (all tensors, tokenizer, chat template), as llama.cpp would."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter

from test_tokenizer import gpt2_meta

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN, CONTEXT = 32, 1, 4, 2, 48, 64


def _add_metadata(w: GGUFWriter, meta: dict, tokenizer: bool, omit: tuple[str, ...]) -> None:
    for add, value in [(w.add_block_count, LAYERS), (w.add_context_length, CONTEXT),
                       (w.add_embedding_length, HIDDEN), (w.add_feed_forward_length, FFN),
                       (w.add_head_count, HEADS), (w.add_head_count_kv, KV_HEADS),
                       (w.add_layer_norm_rms_eps, 1e-5), (w.add_rope_freq_base, 10000.0),
                       (w.add_vocab_size, len(meta["tokenizer.ggml.tokens"]))]:
        add(value)
    if not tokenizer:
        return
    adders = {"tokenizer.ggml.model": w.add_tokenizer_model, "tokenizer.ggml.pre": w.add_tokenizer_pre,
              "tokenizer.ggml.tokens": w.add_token_list, "tokenizer.ggml.token_type": w.add_token_types,
              "tokenizer.ggml.merges": w.add_token_merges, "tokenizer.ggml.bos_token_id": w.add_bos_token_id,
              "tokenizer.ggml.eos_token_id": w.add_eos_token_id, "tokenizer.ggml.add_bos_token": w.add_add_bos_token,
              "tokenizer.chat_template": w.add_chat_template}
    for key, add in adders.items():
        if key not in omit:
            add(meta[key])


def _tensors(vocab: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """GGUF names → float32 arrays in PyTorch (out, in) order (the writer reverses the shape itself)."""
    kv, q = KV_HEADS * HIDDEN // HEADS, HIDDEN
    out = {"token_embd.weight": (vocab, HIDDEN), "output_norm.weight": (HIDDEN,), "output.weight": (vocab, HIDDEN)}
    for i in range(LAYERS):
        out |= {f"blk.{i}.attn_norm.weight": (HIDDEN,), f"blk.{i}.ffn_norm.weight": (HIDDEN,),
                f"blk.{i}.attn_q.weight": (q, HIDDEN), f"blk.{i}.attn_k.weight": (kv, HIDDEN),
                f"blk.{i}.attn_v.weight": (kv, HIDDEN), f"blk.{i}.attn_output.weight": (HIDDEN, q),
                f"blk.{i}.ffn_gate.weight": (FFN, HIDDEN), f"blk.{i}.ffn_up.weight": (FFN, HIDDEN),
                f"blk.{i}.ffn_down.weight": (HIDDEN, FFN)}
    return {name: (rng.standard_normal(shape) * 0.2).astype(np.float32) for name, shape in out.items()}


def write_tiny_gguf(path: Path, arch: str = "llama", tokenizer: bool = True, omit: tuple[str, ...] = ()) -> Path:
    """The tiny model; `omit`: tokenizer keys left out, as a writer that does not know them would."""
    meta = gpt2_meta()
    w = GGUFWriter(path, arch)
    _add_metadata(w, meta, tokenizer, omit)
    for name, data in _tensors(len(meta["tokenizer.ggml.tokens"]), np.random.default_rng(0)).items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
