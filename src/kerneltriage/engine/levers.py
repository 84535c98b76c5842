"""The lever registry: named, composable changes applied from outside the model, each answering one question.

This file names them and says which question each answers; each backend implements them
(`backends/torch/accelerate.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from kerneltriage.core.errors import InputError

QUESTIONS = ("delete", "fast-path", "dispatch", "kernel")


@dataclass(frozen=True)
class Lever:
    name: str
    question: str
    summary: str

    def __post_init__(self) -> None:
        if self.question not in QUESTIONS:
            raise ValueError(f"lever {self.name}: question {self.question!r} not in {QUESTIONS}")


LEVERS: dict[str, Lever] = {
    lever.name: lever
    for lever in (
        Lever("last_logits", "delete", "prefill computes the output projection for the last position only"),
        Lever("graphs", "dispatch", "decode step replayed from CUDA graphs (static cache, one graph per window)"),
        *(Lever(f"compile={mode}", "dispatch", f"decode step through torch.compile (mode {mode})")
          for mode in ("default", "max-autotune-no-cudagraphs")),
        Lever("one_sync", "dispatch", "one host readback per token; the next step is queued before it"),
        Lever("packed_qkv", "dispatch", "q, k, v from one matmul instead of three"),
        Lever("packed_gate_up", "dispatch", "gate and up from one matmul instead of two"),
        Lever("fused_norm", "fast-path", "RMSNorm as one fused F.rms_norm call with its weight"),
        *(Lever(f"sdpa_backend={name}", "fast-path", f"attention pinned to the {name} SDPA backend")
          for name in ("flash", "efficient", "cudnn", "math")),
        Lever("sdpa_fold", "fast-path", "decode attention with each KV head's query heads folded into one query "
                                        "block: no backend needs GQA support (efficient attention refuses it)"),
        Lever("flex_decode", "fast-path", "decode attention through compiled FlexAttention, whose decoding kernel "
                                          "splits the keys across the SMs (flash-decoding)"),
        Lever("sdpa_pad", "fast-path", "head_dim zero-padded to the nearest size a fused SDPA backend takes, when "
                                       "none takes the model's own"),
    )
}


def parse_levers(text: str | None) -> tuple[str, ...]:
    """`a,b` → ('a', 'b'); empty → (); an unknown name is an InputError listing the known ones."""
    names = tuple(name.strip() for name in (text or "").split(",") if name.strip())
    for name in names:
        if name not in LEVERS:
            raise InputError(f"--levers: unknown lever {name!r}; expected some of {', '.join(LEVERS)}")
    if len(set(names)) != len(names):
        raise InputError(f"--levers {text!r}: a lever is named twice")
    return names
