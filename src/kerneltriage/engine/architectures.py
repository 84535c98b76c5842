"""The architectures kerneltriage runs: one record each, from which every other place derives what it needs to know
about one (config readers and writers, the GGUF reader, the peers, the backends' model registries, the tests).

An architecture's name is ours, the GGUF's `general.architecture` and the model file's name in each backend
(`backends/{torch,mlx}/models/NAME.py`). Every one is a pre-norm decoder with GQA, RoPE, RMSNorm and a SwiGLU MLP,
held in the HF/NeoX rotary layout (the two halves of each head rotated together); what differs is recorded here.
"""

from __future__ import annotations

from dataclasses import dataclass

# llama.cpp's rotary styles: NORM rotates adjacent pairs (its converter permutes HF's Q/K rows to match, and
# reading a GGUF undoes it: names.gguf_unpermute_rows); NEOX rotates the two halves, as HF does (rows as stored).
ROPE_NORM, ROPE_NEOX = "norm", "neox"


@dataclass(frozen=True)
class Architecture:
    """What one architecture is, for every reader and writer of it."""

    name: str  # ours, the GGUF's general.architecture, the backends' model file
    hf_model_types: tuple[str, ...]  # config.json `model_type` values read as this architecture; the first is written
    hf_config: str  # the transformers config class that builds it
    attention_bias: bool  # q, k and v projections always carry biases (else only where config.json says so)
    qk_norm: bool  # an RMSNorm on each head's q and k before RoPE
    gguf_rope: str  # llama.cpp's rotary style (ROPE_NORM: the GGUF's Q/K rows are permuted)
    tie_embeddings: bool = False  # config.json's default for tie_word_embeddings

    def __post_init__(self) -> None:
        if not self.hf_model_types:
            raise ValueError(f"architecture {self.name}: expected at least one HF model_type")
        if self.gguf_rope not in (ROPE_NORM, ROPE_NEOX):
            raise ValueError(f"architecture {self.name}: gguf_rope={self.gguf_rope!r}, expected norm or neox")

    @property
    def hf_model_type(self) -> str:
        """The `model_type` written for it (a draft folder, a peer's config)."""
        return self.hf_model_types[0]

    @property
    def hf_class(self) -> str:
        """The `architectures[0]` written in config.json: transformers' causal-LM class."""
        return self.hf_config.removesuffix("Config") + "ForCausalLM"

    @property
    def gguf_permuted_qk(self) -> bool:
        """llama.cpp's converter permuted this architecture's Q/K rows (and their biases)."""
        return self.gguf_rope == ROPE_NORM


ARCHITECTURES: dict[str, Architecture] = {arch.name: arch for arch in (
    Architecture("llama", ("llama", "mistral"), "LlamaConfig", attention_bias=False, qk_norm=False,
                 gguf_rope=ROPE_NORM),
    Architecture("qwen2", ("qwen2",), "Qwen2Config", attention_bias=True, qk_norm=False, gguf_rope=ROPE_NEOX),
    Architecture("qwen3", ("qwen3",), "Qwen3Config", attention_bias=False, qk_norm=True, gguf_rope=ROPE_NEOX),
)}
HF_MODEL_TYPES: dict[str, Architecture] = {t: arch for arch in ARCHITECTURES.values() for t in arch.hf_model_types}


def architecture(name: str) -> Architecture:
    """The record of `name`; an unknown name is a ValueError listing the known ones."""
    try:
        return ARCHITECTURES[name]
    except KeyError:
        raise ValueError(f"architecture {name!r}: expected one of {', '.join(ARCHITECTURES)}") from None
