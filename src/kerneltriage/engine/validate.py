"""Validate before allocating: a weight file's tensor table against its own bytes, and against the sizes its
header claims, before any model is built.

A header is only a claim: one flipped byte gave `llama.block_count` = 2,949,150 (the loader built layer after
layer until the OOM killer came) or a 4 TB embedding. Every size the model will be built from is therefore
checked against a tensor that is actually in the file, and every tensor against the bytes it occupies.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from kerneltriage.core.errors import InputError
from kerneltriage.engine import names
from kerneltriage.engine.config import ModelConfig
from kerneltriage.engine.gguf_header import TensorInfo

_LAYER = re.compile(r"^layers\.(\d+)\.")


def check_layout(source: str, tensors: Sequence[TensorInfo], data_offset: int, alignment: int,
                 file_size: int) -> None:
    """Every tensor's bytes aligned, inside the data section, and spanning exactly what its type and shape
    need: consecutive tensors neither overlap nor leave a gap of a whole alignment unit (a type rewritten to a
    smaller one leaves such a gap, its bytes reinterpreted; to a larger one, an overlap)."""
    ordered = sorted(tensors, key=lambda t: t.offset)
    for tensor in ordered:
        if (tensor.offset - data_offset) % alignment:
            raise InputError(f"{source}: tensor {tensor.name!r} at byte {tensor.offset} is off the file's "
                             f"{alignment}-byte alignment (data starts at {data_offset})")
        end = tensor.offset + tensor.nbytes
        if tensor.offset < data_offset or end > file_size:
            raise InputError(f"{source}: truncated or corrupt: tensor {tensor.name!r} spans bytes "
                             f"{tensor.offset}..{end} but the data is bytes {data_offset}..{file_size}")
    ends = [(t.offset + t.nbytes, t.name) for t in ordered]
    for (end, name), after in zip(ends, [*ordered[1:], None]):
        start, next_name = (after.offset, repr(after.name)) if after else (file_size, "the end of the file")
        if end > start:
            raise InputError(f"{source}: tensor {name!r} (to byte {end}) overlaps {next_name} (from byte {start})")
        if start - end >= alignment:
            raise InputError(f"{source}: {start - end} bytes between tensor {name!r} and {next_name} belong to "
                             f"no tensor: its type or shape does not match its bytes")


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Internal tensor name → the shape the config implies, for every weight the model needs."""
    hidden, ffn, q, kv = config.hidden_size, config.intermediate_size, config.q_size, config.kv_size
    layer = {"attn_norm": (hidden,), "mlp_norm": (hidden,), "q": (q, hidden), "k": (kv, hidden),
             "v": (kv, hidden), "o": (hidden, q), "gate": (ffn, hidden), "up": (ffn, hidden), "down": (hidden, ffn)}
    if config.attention_bias:
        layer |= {"q_bias": (q,), "k_bias": (kv,), "v_bias": (kv,)}
    if config.qk_norm:
        layer |= {"q_norm": (config.head_dim,), "k_norm": (config.head_dim,)}
    if config.architecture.sandwich_norms:
        layer |= {"attn_post_norm": (hidden,), "mlp_post_norm": (hidden,)}
    shapes = {"embed": (config.vocab_size, hidden), "norm": (hidden,)}
    if not config.tie_embeddings:
        shapes["lm_head"] = (config.vocab_size, hidden)
    for index in range(config.num_layers):
        shapes |= {f"layers.{index}.{suffix}": shape for suffix, shape in layer.items()}
    return shapes


def check_tensors(source: str, config: ModelConfig, shapes: Mapping[str, tuple[int, ...]],
                  which: int | None = None) -> None:
    """The header's sizes against the tensors present (internal name → shape): the layer count equals the
    layers found, every weight the model needs is there with the shape the sizes imply, nothing is left over.
    `which` (names.GGUF / names.HF) spells tensor names as the file does in messages."""
    _check_layer_count(source, config, shapes, which)
    expected = expected_shapes(config)
    # Llama-3 GGUFs carry rope scaling as a tensor; some tied checkpoints store the head anyway.
    optional = {"rope_freqs": (config.head_dim // 2,), "lm_head": (config.vocab_size, config.hidden_size)}
    for name, shape in shapes.items():
        want = expected.get(name) or optional.get(name)
        if want is None:
            raise InputError(f"{source}: tensor {_spell(name, which, config.arch)} has no place in a {config.arch} "
                             f"model of this header's sizes")
        if tuple(shape) != want:
            raise InputError(f"{source}: tensor {_spell(name, which, config.arch)} has shape {tuple(shape)}; the "
                             f"header's sizes ({_sizes(config)}) imply {want}")
    missing = [name for name in expected if name not in shapes]
    if missing:
        listed = ", ".join(_spell(n, which, config.arch) for n in missing[:3])
        raise InputError(f"{source}: {len(missing)} tensor(s) missing, e.g. {listed}")


def _check_layer_count(source: str, config: ModelConfig, shapes: Mapping[str, tuple[int, ...]],
                       which: int | None) -> None:
    """Checked first, alone: a wrong count otherwise reads as thousands of missing tensors."""
    found = {int(m.group(1)) for name in shapes if (m := _LAYER.match(name))}
    # Distinct non-negative indices are exactly 0..n-1 when there are n of them and the largest is n-1
    # (never build range(n): n is the claim under test, and may be 2^31).
    if len(found) != config.num_layers or max(found, default=-1) != config.num_layers - 1:
        seen = f"layers 0..{max(found)} ({len(found)} distinct)" if found else "no layers"
        keys: dict[int | None, str] = {names.GGUF: f"{config.arch}.block_count", names.HF: "num_hidden_layers"}
        key = keys.get(which, "num_layers")
        raise InputError(f"{source}: the header says {key} = {config.num_layers:,} but the file has tensors "
                         f"for {seen}")


def _spell(internal: str, which: int | None, arch: str = "") -> str:
    return repr(names.from_internal(internal, which, arch) if which is not None else internal)


def _sizes(config: ModelConfig) -> str:
    return (f"vocab {config.vocab_size}, hidden {config.hidden_size}, ffn {config.intermediate_size}, "
            f"heads {config.num_heads}/{config.num_kv_heads} x {config.head_dim}")
