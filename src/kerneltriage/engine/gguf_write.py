"""Write a GGUF with a model config's shapes and deterministic random weights, blocks written directly.

What it is for: kerneltriage and llama.cpp reading the same quantized file on a machine without network (an 8B
in Q4_0 on the GPU machine). Timing does not depend on the weights' values, so no float model is ever made: each
tensor's blocks are bytes taken from one random pool (from an offset of its own), their scales then set so that
the values are ≈ N(0, INIT_STD), as the presets' float weights are. One tensor is in memory at a time.

The vocabulary is synthetic and sentencepiece-shaped (`tokenizer.ggml.model` "llama", llama.cpp's SPM): `<unk>`,
`<s>`, `</s>`, the 256 byte tokens `<0x00>`…`<0xFF>` (llama.cpp spells any text through them) and made-up pieces
with falling scores, so that both llama.cpp and transformers' GGUF conversion build a tokenizer from it.
"""

from __future__ import annotations

import itertools
import os
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, LlamaFileType, TokenType

from kerneltriage.core.errors import InputError
from kerneltriage.engine import names
from kerneltriage.engine.config import ModelConfig
from kerneltriage.engine.rope import rope_inv_freq
from kerneltriage.engine.validate import expected_shapes

INIT_STD = 0.02  # the presets' float weights: N(0, 0.02) (backends' load.py)
SEED = 0
POOL_BYTES = (1 << 24) + 4099  # random bytes every tensor tiles; odd, so rows of a tensor start at shifting phases
FILE_TYPES = {"Q4_0": LlamaFileType.MOSTLY_Q4_0, "Q4_1": LlamaFileType.MOSTLY_Q4_1, "Q8_0": LlamaFileType.MOSTLY_Q8_0}
TYPES = tuple(FILE_TYPES)
# Per block: bytes before the quants (fp16 d, and Q4_1's fp16 m) and the spread of its quants' values around their
# centre (uniform 4-bit q − 8: 4.61; uniform int8: 73.9), so that d = INIT_STD / spread.
_HEAD = {"Q4_0": 2, "Q4_1": 4, "Q8_0": 2}
_SPREAD = {"Q4_0": 4.61, "Q4_1": 4.61, "Q8_0": 73.9}
SPECIAL = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2: llama.cpp's SPM defaults
UNK, BOS, EOS = 0, 1, 2


@dataclass(frozen=True)
class Written:
    """What `write_gguf` wrote: the file, its bytes and its tensor count."""

    path: Path
    size_bytes: int
    tensors: int


def write_gguf(config: ModelConfig, qtype: str, path: Path, name: str | None = None) -> Written:
    """A GGUF at `path` with `config`'s shapes: matrices as `qtype` blocks of random values, norms at 1, rope
    factors where the config scales rope. Written to a temporary name and renamed: never half a file."""
    if qtype not in FILE_TYPES:
        raise InputError(f"GGUF type {qtype!r}: expected one of {', '.join(TYPES)}")
    path = Path(path)
    if not path.parent.is_dir():
        raise InputError(f"{path}: its folder {path.parent} does not exist")
    shapes = _tensor_shapes(config, qtype)
    partial = path.with_name(f".{path.name}.partial")
    writer = GGUFWriter(partial, config.arch)
    try:
        _add_metadata(writer, config, qtype, name or f"{config.name or config.arch}-random-{qtype}")
        for tensor_name, (shape, kind) in shapes.items():
            if kind == "F32":
                writer.add_tensor_info(tensor_name, shape, np.dtype(np.float32), _nbytes(shape, kind))
            else:  # a quantized tensor is declared by its bytes: (rows, bytes per row)
                writer.add_tensor_info(tensor_name, (shape[0], _nbytes(shape[1:], kind)), np.dtype(np.uint8),
                                       _nbytes(shape, kind), GGMLQuantizationType[kind])
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        pool = np.random.default_rng(SEED).integers(0, 256, POOL_BYTES, dtype=np.uint8)
        for index, (tensor_name, (shape, kind)) in enumerate(shapes.items()):
            writer.write_tensor_data(_tensor(config, tensor_name, shape, kind, pool, index))
        writer.close()
        os.replace(partial, path)
    finally:  # an error (or Ctrl-C) leaves no partial file behind; after the rename there is none to remove
        writer.close()
        partial.unlink(missing_ok=True)
    return Written(path, path.stat().st_size, len(shapes))


def _tensor_shapes(config: ModelConfig, qtype: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """GGUF name → (shape, type) of every weight of the model: matrices in `qtype`, 1-D tensors (norms, rope
    factors) in F32."""
    shapes = dict(expected_shapes(config))
    if config.rope_scaling is not None:
        shapes["rope_freqs"] = (config.head_dim // 2,)
    block = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]][0]
    out = {}
    for internal, shape in shapes.items():
        tensor_name = names.from_internal(internal, names.GGUF)
        if len(shape) == 2 and shape[-1] % block:
            raise InputError(f"{config.name or config.arch}: tensor {tensor_name}'s rows of {shape[-1]} values are "
                             f"not whole {qtype} blocks of {block}")
        out[tensor_name] = (shape, qtype if len(shape) == 2 else "F32")
    return out


def _nbytes(shape: tuple[int, ...], kind: str) -> int:
    """Bytes of a tensor of `shape` in `kind` (whole blocks along its last axis)."""
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    return int(np.prod(shape[:-1], dtype=np.int64)) * shape[-1] // block * size


def _tensor(config: ModelConfig, tensor_name: str, shape: tuple[int, ...], kind: str, pool: np.ndarray,
            index: int) -> np.ndarray:
    """The tensor's bytes (quantized: (rows, bytes per row) uint8) or values (F32)."""
    if tensor_name == names.from_internal("rope_freqs", names.GGUF):
        return _rope_factors(config)
    if kind == "F32":
        return np.ones(shape, dtype=np.float32)
    data = _tiled(pool, (index * 7_919_993) % POOL_BYTES, _nbytes(shape, kind))  # a prime stride between tensors
    blocks = data.reshape(-1, GGML_QUANT_SIZES[GGMLQuantizationType[kind]][1])  # (n_blocks, bytes per block)
    _set_scales(blocks, kind)
    return data.reshape(shape[0], -1) if len(shape) == 2 else data


def _tiled(pool: np.ndarray, start: int, nbytes: int) -> np.ndarray:
    """`nbytes` bytes of the pool read cyclically from `start` (copies of whole runs, no index arrays)."""
    out = np.empty(nbytes, dtype=np.uint8)
    done = 0
    while done < nbytes:
        run = min(nbytes - done, len(pool) - start)
        out[done:done + run] = pool[start:start + run]
        done, start = done + run, 0
    return out


def _set_scales(blocks: np.ndarray, kind: str) -> None:
    """Each block's d from its first byte (a spread of 0.5–1.5 × INIT_STD / spread); Q4_1's m = −8·d, so that its
    values d·q + m are centred as Q4_0's d·(q − 8) are."""
    table = (INIT_STD / _SPREAD[kind] * (0.5 + np.arange(256) / 256)).astype(np.float16)  # byte → d
    d = table[blocks[:, 0]]  # (n_blocks,)
    blocks[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
    if kind == "Q4_1":
        blocks[:, 2:4] = (-8 * d).astype(np.float16).view(np.uint8).reshape(-1, 2)


def _rope_factors(config: ModelConfig) -> np.ndarray:
    """llama.cpp's `rope_freqs`: per frequency, the divisor Llama-3 scaling applies (unscaled / scaled)."""
    plain = rope_inv_freq(config.replace(rope_scaling=None)).astype(np.float64)
    return (plain / rope_inv_freq(config).astype(np.float64)).astype(np.float32)


def _add_metadata(writer: GGUFWriter, config: ModelConfig, qtype: str, name: str) -> None:
    writer.add_name(name)
    writer.add_file_type(FILE_TYPES[qtype])
    writer.add_quantization_version(2)
    writer.add_vocab_size(config.vocab_size)
    writer.add_context_length(config.max_context)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_block_count(config.num_layers)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_layer_norm_rms_eps(config.rms_eps)
    _add_vocabulary(writer, config.vocab_size)


def _add_vocabulary(writer: GGUFWriter, size: int) -> None:
    """A sentencepiece vocabulary of `size` tokens: specials, bytes, then pieces (SPM merges by score: higher first)."""
    tokens = synthetic_vocabulary(size)
    types = ([TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
             + [TokenType.NORMAL] * (size - 259))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_merges(_merges(tokens))
    writer.add_token_scores([0.0] * 259 + [-float(i) for i in range(size - 259)])
    writer.add_token_types(types)
    writer.add_unk_token_id(UNK)
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)


def synthetic_vocabulary(size: int) -> list[str]:
    """`size` distinct tokens: `<unk>`, `<s>`, `</s>`, `<0x00>`…`<0xFF>`, then pieces `▁`, `▁a`, `a`, … `▁aa`, …"""
    fixed = [*SPECIAL, *(f"<0x{byte:02X}>" for byte in range(256))]
    if size < len(fixed):
        raise InputError(f"vocabulary of {size} tokens: a synthetic one needs at least {len(fixed)} (specials and "
                         "the 256 byte tokens)")
    return fixed + list(itertools.islice(_pieces(), size - len(fixed)))


def _merges(tokens: list[str]) -> list[str]:
    """Each piece as its prefix and last character, shorter pieces first. llama.cpp's SPM tokenizer merges by score
    and reads none of these; transformers' conversion would otherwise derive them from the vocabulary (a minute for
    128k tokens)."""
    known = set(tokens)
    pieces = tokens[len(SPECIAL) + 256:]
    return [f"{p[:-1]} {p[-1]}" for p in pieces if len(p) > 1 and p[:-1] in known and p[-1] in known]


def _pieces() -> Iterator[str]:
    """`▁` (sentencepiece's space, which every word start merges from), then lower-case words in order of length,
    each as a word start (`▁word`) and as a continuation (`word`)."""
    yield "\u2581"
    for length in itertools.count(1):
        for letters in itertools.product(string.ascii_lowercase, repeat=length):
            word = "".join(letters)
            yield "\u2581" + word
            yield word
