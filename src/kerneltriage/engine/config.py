"""ModelConfig: the shapes and constants of a Llama-family model, from GGUF metadata or config.json."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from kerneltriage.core.errors import InputError
from kerneltriage.engine import architectures
from kerneltriage.engine.architectures import HF_MODEL_TYPES, Architecture
from kerneltriage.engine.metadata import SettingsReader, is_int

ARCHITECTURES = tuple(architectures.ARCHITECTURES)  # their names (engine/architectures.py has what each is)
# Positions a model may claim: 16M is 100x the longest real context; 2^31-1 (a fuzzed header) is not a model.
MAX_CONTEXT = 1 << 24


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 style frequency scaling (`rope_type: llama3`)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position: int

    def __post_init__(self) -> None:
        factors = (self.factor, self.low_freq_factor, self.high_freq_factor)
        if not all(math.isfinite(f) and f > 0 for f in factors) or self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(f"rope scaling: bad factors {self}")
        if self.original_max_position <= 0:
            raise ValueError(f"rope scaling: original_max_position={self.original_max_position}, expected > 0")

    def to_hf(self) -> dict[str, Any]:
        """As config.json spells it (`rope_scaling`)."""
        return {"rope_type": "llama3", "factor": self.factor, "low_freq_factor": self.low_freq_factor,
                "high_freq_factor": self.high_freq_factor,
                "original_max_position_embeddings": self.original_max_position}


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
            if not is_int(value) or value <= 0:
                raise ValueError(f"{attr}={value!r}: expected a positive integer")
        if self.max_context > MAX_CONTEXT:
            raise ValueError(f"max_context={self.max_context}: expected at most {MAX_CONTEXT:,} positions")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim}: rotary embedding needs an even head_dim")
        for attr in ("rope_theta", "rms_eps"):
            value = getattr(self, attr)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{attr}={value!r}: expected a finite positive number")
        self._check_token_ids()

    def _check_token_ids(self) -> None:
        for tok in (*self.eos_token_ids, *(() if self.bos_token_id is None else (self.bos_token_id,))):
            if not is_int(tok) or not 0 <= tok < self.vocab_size:
                raise ValueError(f"special token id {tok!r} outside the vocabulary of {self.vocab_size}")

    @property
    def architecture(self) -> Architecture:
        """What this architecture is (engine/architectures.py)."""
        return architectures.ARCHITECTURES[self.arch]

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
        """Build from a Hugging Face config.json dictionary; a missing or bad value is an InputError naming it."""
        model_type = cfg.get("model_type", "")
        record = HF_MODEL_TYPES.get(model_type) if isinstance(model_type, str) else None
        if record is None:
            raise InputError(f"config.json model_type {model_type!r}: expected one of {', '.join(HF_MODEL_TYPES)}")
        read = SettingsReader(cfg, "config.json")
        heads, hidden = read.size("num_attention_heads"), read.size("hidden_size")
        return _build(
            "config.json", arch=record.name, vocab_size=read.size("vocab_size"), hidden_size=hidden,
            intermediate_size=read.size("intermediate_size"), num_layers=read.size("num_hidden_layers"),
            num_heads=heads, num_kv_heads=read.size("num_key_value_heads", heads),
            head_dim=read.size("head_dim", hidden // heads), max_context=read.size("max_position_embeddings", 4096),
            rope_theta=read.number("rope_theta", (read.mapping("rope_parameters") or {}).get("rope_theta", 10000.0)),
            rms_eps=read.number("rms_norm_eps", 1e-5),
            tie_embeddings=read.flag("tie_word_embeddings", record.tie_embeddings),
            attention_bias=record.attention_bias or read.flag("attention_bias"), qk_norm=record.qk_norm,
            rope_scaling=_hf_rope_scaling(read), bos_token_id=read.token("bos_token_id"),
            eos_token_ids=read.tokens("eos_token_id"), name=name,
        )

    def to_hf(self) -> dict[str, Any]:
        """This config as a Hugging Face config.json dictionary, which `from_hf` reads back: a draft folder's
        config, a peer's model built to our shapes."""
        arch = self.architecture
        hf = {"model_type": arch.hf_model_type, "architectures": [arch.hf_class], "vocab_size": self.vocab_size,
              "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
              "num_hidden_layers": self.num_layers, "num_attention_heads": self.num_heads,
              "num_key_value_heads": self.num_kv_heads, "head_dim": self.head_dim,
              "max_position_embeddings": self.max_context, "rope_theta": self.rope_theta, "rms_norm_eps": self.rms_eps,
              "tie_word_embeddings": self.tie_embeddings, "attention_bias": self.attention_bias,
              "bos_token_id": self.bos_token_id, "eos_token_id": list(self.eos_token_ids)}
        return hf | ({} if self.rope_scaling is None else {"rope_scaling": self.rope_scaling.to_hf()})

    @classmethod
    def from_gguf(cls, meta: Mapping[str, Any], has_output_tensor: bool, name: str = "") -> "ModelConfig":
        """Build from GGUF key/value metadata (`{arch}.block_count`, …); a bad value is an InputError naming it.

        Llama-3 rope scaling travels in GGUF as a `rope_freqs` tensor, not as metadata: the loader applies it.
        """
        arch = meta.get("general.architecture", "")
        if arch not in ARCHITECTURES:
            raise InputError(f"GGUF general.architecture {arch!r}: expected one of {', '.join(ARCHITECTURES)}")
        record = architectures.ARCHITECTURES[arch]
        read = SettingsReader(meta, "GGUF metadata", prefix=f"{arch}.")
        heads, hidden = read.size("attention.head_count"), read.size("embedding_length")
        tokens = meta.get("tokenizer.ggml.tokens")
        vocab = read.size("vocab_size", len(tokens) if isinstance(tokens, list) and tokens else None)
        global_read = SettingsReader(meta, "GGUF metadata")
        eos = global_read.token("tokenizer.ggml.eos_token_id")
        return _build(
            "GGUF metadata", arch=arch, vocab_size=vocab if vocab is not None else read.size("vocab_size"),
            hidden_size=hidden, intermediate_size=read.size("feed_forward_length"),
            num_layers=read.size("block_count"), num_heads=heads,
            num_kv_heads=read.size("attention.head_count_kv", heads),
            head_dim=read.size("attention.key_length", None) or read.size("rope.dimension_count", hidden // heads),
            max_context=read.size("context_length"), rope_theta=read.number("rope.freq_base", 10000.0),
            rms_eps=read.number("attention.layer_norm_rms_epsilon"), tie_embeddings=not has_output_tensor,
            attention_bias=record.attention_bias, qk_norm=record.qk_norm,
            bos_token_id=global_read.token("tokenizer.ggml.bos_token_id"),
            eos_token_ids=() if eos is None else (eos,), name=name,
        )


def _build(what: str, **fields: Any) -> ModelConfig:
    """A ModelConfig whose own checks (divisibility, bounds, token ids in the vocabulary) say `what` failed."""
    try:
        return ModelConfig(**fields)
    except ValueError as exc:
        raise InputError(f"{what}: {exc}") from None


def _hf_rope_scaling(read: SettingsReader) -> RopeScaling | None:
    rs = read.mapping("rope_scaling") or read.mapping("rope_parameters")
    if not rs or rs.get("rope_type", rs.get("type")) != "llama3":
        return None
    scaling = SettingsReader(rs, "config.json rope_scaling")
    try:
        return RopeScaling(
            factor=scaling.number("factor"),
            low_freq_factor=scaling.number("low_freq_factor"),
            high_freq_factor=scaling.number("high_freq_factor"),
            original_max_position=scaling.size("original_max_position_embeddings"),
        )
    except ValueError as exc:
        raise InputError(f"config.json: {exc}") from None
