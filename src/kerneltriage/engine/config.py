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
    # gemma3: every sliding_pattern-th layer global, the others attending over the last sliding_window positions
    # (their own included), rotated with base rope_local_theta
    sliding_window: int | None = None
    sliding_pattern: int = 0
    rope_local_theta: float | None = None
    query_pre_attn_scalar: int | None = None  # attention scores scaled by its -1/2 power (None: head_dim's)
    final_logit_softcapping: float | None = None  # logits = c·tanh(logits / c) (None: uncapped)
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
        for attr in ("rope_theta", "rms_eps", "rope_local_theta", "query_pre_attn_scalar", "final_logit_softcapping"):
            value = getattr(self, attr)
            optional = attr not in ("rope_theta", "rms_eps")
            if (value is not None or not optional) and (
                    not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0):
                raise ValueError(f"{attr}={value!r}: expected a finite positive number")
        self._check_sliding()
        self._check_token_ids()

    def _check_sliding(self) -> None:
        window, pattern = self.sliding_window, self.sliding_pattern
        if window is not None and (not is_int(window) or window <= 0):
            raise ValueError(f"sliding_window={window!r}: expected a positive integer")
        if not is_int(pattern) or pattern < 0 or (pattern > 0) != (window is not None):
            raise ValueError(f"sliding_pattern={pattern!r}: expected a positive integer with a sliding_window "
                             f"({window!r}), else 0")

    @property
    def sliding_layers(self) -> int:
        """How many layers attend over a sliding window."""
        return sum(self.sliding(layer) for layer in range(self.num_layers))

    def sliding(self, layer: int) -> bool:
        """Layer `layer` attends over a sliding window (every sliding_pattern-th layer attends globally)."""
        return self.sliding_window is not None and (layer + 1) % self.sliding_pattern != 0

    def _check_token_ids(self) -> None:
        for tok in (*self.eos_token_ids, *(() if self.bos_token_id is None else (self.bos_token_id,))):
            if not is_int(tok) or not 0 <= tok < self.vocab_size:
                raise ValueError(f"special token id {tok!r} outside the vocabulary of {self.vocab_size}")

    @property
    def architecture(self) -> Architecture:
        """What this architecture is (engine/architectures.py)."""
        return architectures.ARCHITECTURES[self.arch]

    @property
    def norms_per_layer(self) -> int:
        """RMSNorms over the hidden state in each layer: before attention and MLP (Gemma-3: after each too)."""
        return 4 if self.architecture.sandwich_norms else 2

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
            rope_theta=read.number("rope_theta", _hf_rope_parameters(read, "full_attention").get("rope_theta", 1e4)),
            rms_eps=read.number("rms_norm_eps", 1e-5),
            tie_embeddings=read.flag("tie_word_embeddings", record.tie_embeddings),
            attention_bias=record.attention_bias or read.flag("attention_bias"), qk_norm=record.qk_norm,
            rope_scaling=_hf_rope_scaling(read), bos_token_id=read.token("bos_token_id"),
            eos_token_ids=read.tokens("eos_token_id"), name=name, **_hf_sliding(read, record),
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
        hf |= {} if self.rope_scaling is None else {"rope_scaling": self.rope_scaling.to_hf()}
        return hf | self._hf_sliding()

    def _hf_sliding(self) -> dict[str, Any]:
        """Gemma-3's keys, as its config.json spells them (`layer_types` derived: transformers reads it first)."""
        if self.sliding_window is None:
            return {}
        types = ["sliding_attention" if self.sliding(i) else "full_attention" for i in range(self.num_layers)]
        return {"sliding_window": self.sliding_window, "sliding_window_pattern": self.sliding_pattern,
                "layer_types": types, "rope_local_base_freq": self.rope_local_theta,
                "query_pre_attn_scalar": self.query_pre_attn_scalar,
                "final_logit_softcapping": self.final_logit_softcapping}

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
            eos_token_ids=() if eos is None else (eos,), name=name, **_gguf_sliding(read, record),
        )


def _build(what: str, **fields: Any) -> ModelConfig:
    """A ModelConfig whose own checks (divisibility, bounds, token ids in the vocabulary) say `what` failed."""
    try:
        return ModelConfig(**fields)
    except ValueError as exc:
        raise InputError(f"{what}: {exc}") from None


def _gguf_sliding(read: SettingsReader, record: Architecture) -> dict[str, Any]:
    """Gemma-3's sliding layers from GGUF metadata: the window is a key, the pattern and the local RoPE base are
    what llama.cpp assumes (the record's), the query scale head_dim's (llama.cpp's for every size but 27B's)."""
    if not record.sliding_pattern:
        return {}
    return {"sliding_window": read.size("attention.sliding_window"), "sliding_pattern": record.sliding_pattern,
            "rope_local_theta": record.rope_local_theta,
            "query_pre_attn_scalar": read.size("attention.key_length"),
            "final_logit_softcapping": read.optional_number("final_logit_softcapping")}


def _hf_sliding(read: SettingsReader, record: Architecture) -> dict[str, Any]:
    """Gemma-3's sliding layers from config.json (`layer_types` wins over `sliding_window_pattern`, as in
    transformers); attention soft-capping is refused: SDPA has no place for it."""
    if not record.sliding_pattern:
        return {}
    if read.optional_number("attn_logit_softcapping") is not None:
        raise InputError("config.json attn_logit_softcapping: attention soft-capping is not supported (expected null)")
    heads, hidden = read.size("num_attention_heads"), read.size("hidden_size")
    local = _hf_rope_parameters(read, "sliding_attention")
    return {"sliding_window": read.size("sliding_window", 4096),
            "sliding_pattern": _hf_pattern(read, record.sliding_pattern),
            "rope_local_theta": read.number("rope_local_base_freq", local.get("rope_theta", record.rope_local_theta)),
            "query_pre_attn_scalar": read.size("query_pre_attn_scalar", read.size("head_dim", hidden // heads)),
            "final_logit_softcapping": read.optional_number("final_logit_softcapping")}


def _hf_rope_parameters(read: SettingsReader, layer_type: str) -> Mapping[str, Any]:
    """`rope_parameters` (transformers 5), flat or (Gemma-3) one entry per layer type: that of `layer_type`."""
    rope = read.mapping("rope_parameters") or {}
    nested = rope.get(layer_type)
    return nested if isinstance(nested, Mapping) else rope


def _hf_pattern(read: SettingsReader, default: int) -> int:
    """The global-layer period: from `layer_types` (which must repeat one), else `sliding_window_pattern`."""
    types = read.data.get("layer_types")
    if types is None:
        return int(read.size("sliding_window_pattern", default))
    if not isinstance(types, list) or not types:
        raise InputError(f"config.json layer_types={types!r}: expected a list of attention types")
    period = types.index("full_attention") + 1 if "full_attention" in types else len(types) + 1
    expected = ["sliding_attention" if (i + 1) % period else "full_attention" for i in range(len(types))]
    if types != expected:
        raise InputError(f"config.json layer_types: expected every Nth layer full_attention, got {types}")
    return period


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
