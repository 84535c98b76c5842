"""ModelConfig: the shapes and constants of a Llama-family model, from GGUF metadata or config.json."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from kerneltriage.core.errors import InputError

ARCHITECTURES = ("llama", "qwen2", "qwen3")

# HF `model_type` / `architectures[0]` → our architecture name.
_HF_MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "mistral": "llama"}


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 style frequency scaling (`rope_type: llama3`)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position: int

    def __post_init__(self) -> None:
        if self.factor <= 0 or self.low_freq_factor <= 0 or self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(f"rope scaling: bad factors {self}")


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_context: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    tie_embeddings: bool = False
    attention_bias: bool = False  # qwen2: biases on q/k/v projections
    qk_norm: bool = False  # qwen3: RMSNorm on q and k per head
    rope_scaling: RopeScaling | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    name: str = ""
    random_weights: bool = False  # presets: real shapes, random values

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"architecture {self.arch!r}: expected one of {', '.join(ARCHITECTURES)}")
        for attr in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_context"):
            value = getattr(self, attr)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{attr}={value!r}: expected a positive integer")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim}: rotary embedding needs an even head_dim")
        if self.rope_theta <= 0 or self.rms_eps <= 0:
            raise ValueError(f"rope_theta={self.rope_theta}, rms_eps={self.rms_eps}: expected positive values")
        for tok in (*self.eos_token_ids, *(() if self.bos_token_id is None else (self.bos_token_id,))):
            if not 0 <= tok < self.vocab_size:
                raise ValueError(f"special token id {tok} outside the vocabulary of {self.vocab_size}")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ModelConfig":
        data = dict(data)
        if data.get("rope_scaling"):
            data["rope_scaling"] = RopeScaling(**data["rope_scaling"])
        data["eos_token_ids"] = tuple(data.get("eos_token_ids", ()))
        return cls(**data)

    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any], name: str = "") -> "ModelConfig":
        """Build from a Hugging Face config.json dictionary."""
        model_type = cfg.get("model_type", "")
        arch = _HF_MODEL_TYPES.get(model_type)
        if arch is None:
            raise InputError(f"config.json model_type {model_type!r}: expected one of {', '.join(_HF_MODEL_TYPES)}")
        try:
            heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            eos = cfg.get("eos_token_id")
            return cls(
                arch=arch,
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                max_context=int(cfg.get("max_position_embeddings", 4096)),
                rope_theta=float(cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))),
                rms_eps=float(cfg.get("rms_norm_eps", 1e-5)),
                tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
                qk_norm=arch == "qwen3",
                rope_scaling=_hf_rope_scaling(cfg),
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_ids=tuple(eos if isinstance(eos, list) else ([] if eos is None else [eos])),
                name=name,
            )
        except KeyError as exc:
            raise InputError(f"config.json: missing key {exc.args[0]!r}") from None
        except ValueError as exc:
            raise InputError(f"config.json: {exc}") from None

    @classmethod
    def from_gguf(cls, meta: Mapping[str, Any], has_output_tensor: bool, name: str = "") -> "ModelConfig":
        """Build from GGUF key/value metadata (`{arch}.block_count`, …).

        Llama-3 rope scaling travels in GGUF as a `rope_freqs` tensor, not as metadata: the loader applies it.
        """
        arch = meta.get("general.architecture", "")
        if arch not in ARCHITECTURES:
            raise InputError(f"GGUF general.architecture {arch!r}: expected one of {', '.join(ARCHITECTURES)}")

        def get(key: str, default: Any = None) -> Any:
            value = meta.get(f"{arch}.{key}", default)
            if value is None:
                raise InputError(f"GGUF metadata: missing {arch}.{key}")
            return value

        heads = int(get("attention.head_count"))
        hidden = int(get("embedding_length"))
        head_dim = int(meta.get(f"{arch}.attention.key_length") or get("rope.dimension_count", hidden // heads))
        vocab = meta.get(f"{arch}.vocab_size") or meta.get("tokenizer.ggml.tokens_count")
        eos = meta.get("tokenizer.ggml.eos_token_id")
        try:
            return cls(
                arch=arch,
                vocab_size=int(vocab if vocab is not None else get("vocab_size")),
                hidden_size=hidden,
                intermediate_size=int(get("feed_forward_length")),
                num_layers=int(get("block_count")),
                num_heads=heads,
                num_kv_heads=int(meta.get(f"{arch}.attention.head_count_kv") or heads),
                head_dim=head_dim,
                max_context=int(get("context_length")),
                rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
                rms_eps=float(get("attention.layer_norm_rms_epsilon")),
                tie_embeddings=not has_output_tensor,
                attention_bias=arch == "qwen2",
                qk_norm=arch == "qwen3",
                bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
                eos_token_ids=() if eos is None else (int(eos),),
                name=name,
            )
        except ValueError as exc:
            raise InputError(f"GGUF metadata: {exc}") from None


def _hf_rope_scaling(cfg: Mapping[str, Any]) -> RopeScaling | None:
    rs = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not rs or rs.get("rope_type", rs.get("type")) != "llama3":
        return None
    return RopeScaling(
        factor=float(rs["factor"]),
        low_freq_factor=float(rs["low_freq_factor"]),
        high_freq_factor=float(rs["high_freq_factor"]),
        original_max_position=int(rs["original_max_position_embeddings"]),
    )

