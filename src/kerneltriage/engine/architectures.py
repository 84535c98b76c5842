"""The architectures kerneltriage runs: one record each, from which every other place derives what it needs to know
about one (config readers and writers, the GGUF reader, the peers, the backends' model registries, the tests).

An architecture's name is ours and the GGUF's `general.architecture`; its `model` names the model file that builds
it in each backend (`backends/{torch,mlx}/models/MODEL.py`): llama's builds llama, qwen2 and qwen3, reading their
biases and q/k norms from these records; Gemma-3 has its own. Every one is a pre-norm decoder with GQA, RoPE,
RMSNorm and a gated MLP, held in the HF/NeoX rotary layout (the two halves of each head rotated together); what
differs is recorded here.
Gemma-3 differs most: (1 + w) norms, four per layer, an embedding scaled by sqrt(hidden), a GELU-tanh gate, and
sliding-window layers with their own RoPE base between its global ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ACTIVATIONS = ("silu", "gelu_tanh")

# llama.cpp's rotary styles: NORM rotates adjacent pairs (its converter permutes HF's Q/K rows to match, and
# reading a GGUF undoes it: names.gguf_unpermute_rows); NEOX rotates the two halves, as HF does (rows as stored).
ROPE_NORM, ROPE_NEOX = "norm", "neox"


@dataclass(frozen=True)
class Architecture:
    """What one architecture is, for every reader and writer of it."""

    name: str  # ours, the GGUF's general.architecture
    hf_model_types: tuple[str, ...]  # config.json `model_type` values read as this architecture; the first is written
    hf_config: str  # the transformers config class that builds it
    attention_bias: bool  # q, k and v projections always carry biases (else only where config.json says so)
    qk_norm: bool  # an RMSNorm on each head's q and k before RoPE
    gguf_rope: str  # llama.cpp's rotary style (ROPE_NORM: the GGUF's Q/K rows are permuted)
    tie_embeddings: bool = False  # config.json's default for tie_word_embeddings
    hf_causal_lm: str = ""  # transformers' causal-LM class where it is not hf_config's name + ForCausalLM
    # HF names of internal layer tensors where this architecture's differ from llama's (engine/names.py)
    hf_names: tuple[tuple[str, str], ...] = ()
    # norms scale by (norm_offset + w): HF and our models hold w, llama.cpp's converter stores norm_offset + w
    norm_offset: float = 0.0
    sandwich_norms: bool = False  # norms on the attention's and the MLP's outputs too, before each residual add
    embed_scale: bool = False  # embedding rows scaled by sqrt(hidden) (the tied output head reads them unscaled)
    mlp_act: str = "silu"  # the gate's activation
    # every Nth layer global, the others sliding-window, with their own RoPE base: what llama.cpp assumes, as its
    # GGUF keys hold neither (0: no sliding layers)
    sliding_pattern: int = 0
    rope_local_theta: float | None = None
    model: str = "llama"  # the backends' model file that builds it (backends/{torch,mlx}/models/MODEL.py)

    def __post_init__(self) -> None:
        if not self.hf_model_types:
            raise ValueError(f"architecture {self.name}: expected at least one HF model_type")
        if self.gguf_rope not in (ROPE_NORM, ROPE_NEOX):
            raise ValueError(f"architecture {self.name}: gguf_rope={self.gguf_rope!r}, expected norm or neox")
        if self.mlp_act not in ACTIVATIONS:
            raise ValueError(f"architecture {self.name}: mlp_act={self.mlp_act!r}, expected one of {ACTIVATIONS}")
        if self.sliding_pattern < 0 or (self.sliding_pattern > 0) != (self.rope_local_theta is not None):
            raise ValueError(f"architecture {self.name}: sliding_pattern={self.sliding_pattern} needs a "
                             f"rope_local_theta (and only then): {self.rope_local_theta!r}")

    @property
    def hf_model_type(self) -> str:
        """The `model_type` written for it (a draft folder, a peer's config)."""
        return self.hf_model_types[0]

    @property
    def hf_class(self) -> str:
        """The `architectures[0]` written in config.json: transformers' causal-LM class."""
        return self.hf_causal_lm or self.hf_config.removesuffix("Config") + "ForCausalLM"

    @property
    def gguf_permuted_qk(self) -> bool:
        """llama.cpp's converter permuted this architecture's Q/K rows (and their biases)."""
        return self.gguf_rope == ROPE_NORM


ARCHITECTURES: dict[str, Architecture] = {arch.name: arch for arch in (
    Architecture("llama", ("llama", "mistral"), "LlamaConfig", attention_bias=False, qk_norm=False,
                 gguf_rope=ROPE_NORM),
    Architecture("qwen2", ("qwen2",), "Qwen2Config", attention_bias=True, qk_norm=False, gguf_rope=ROPE_NEOX),
    Architecture("qwen3", ("qwen3",), "Qwen3Config", attention_bias=False, qk_norm=True, gguf_rope=ROPE_NEOX),
    Architecture("gemma3", ("gemma3_text",), "Gemma3TextConfig", attention_bias=False, qk_norm=True,
                 gguf_rope=ROPE_NEOX, tie_embeddings=True, hf_causal_lm="Gemma3ForCausalLM",
                 hf_names=(("mlp_norm", "model.layers.{i}.pre_feedforward_layernorm.weight"),
                           ("attn_post_norm", "model.layers.{i}.post_attention_layernorm.weight"),
                           ("mlp_post_norm", "model.layers.{i}.post_feedforward_layernorm.weight")),
                 norm_offset=1.0, sandwich_norms=True, embed_scale=True, mlp_act="gelu_tanh", sliding_pattern=6,
                 rope_local_theta=10000.0, model="gemma3"),
)}
HF_MODEL_TYPES: dict[str, Architecture] = {t: arch for arch in ARCHITECTURES.values() for t in arch.hf_model_types}


def architecture(name: str) -> Architecture:
    """The record of `name`; an unknown name is a ValueError listing the known ones."""
    try:
        return ARCHITECTURES[name]
    except KeyError:
        raise ValueError(f"architecture {name!r}: expected one of {', '.join(ARCHITECTURES)}") from None


def model_classes(package: str) -> dict[str, Any]:
    """Architecture name → its Model class in a backend's models package (`package`.`model`.Model, `model` the
    record's): the registry each backend derives from these records (one model file may build several)."""
    import importlib

    return {name: importlib.import_module(f"{package}.{arch.model}").Model for name, arch in ARCHITECTURES.items()}
