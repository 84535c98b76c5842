"""The lever table: one record per lever, everything else derived from it.

A lever is a named change applied to a built model from outside the model code, answering one of the
questions (delete work, unlock a fast path, cut dispatch) or swapping in a custom kernel. Its record says
where it acts (`stage`: the model's modules, the step functions, or the token loop; `seams`: which of the
model's named seams it replaces; `phases`: prefill and/or decode), whether it changes the arithmetic
(`numerics`), where it runs (`backends`, `devices`, `architectures`), how it composes with the others
(`requires`, `clashes`) and what it costs before its first timed run (`warmup`). The table's row order is the
composition order: model changes first, then the steps that call the model (compile before graphs captures it),
then the loop. Backends register one applier per lever name (`backends/<name>/levers.py`); `refusal` says, from the
table alone, why a lever cannot run in a configuration; nothing else lists levers or keys a decision on their names.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass

from kerneltriage.core.errors import InputError
from kerneltriage.engine.backend_names import BACKENDS
from kerneltriage.engine.quality import Quality

QUESTIONS = ("delete", "fast-path", "dispatch", "kernel")
STAGES = ("model", "step", "loop")
# exact: the same arithmetic (greedy digests must match); reorders: other kernels or GEMM shapes, so other
# rounding (judged by a logit tolerance against a float32 reference); approximates: deliberately not the same
# function (judged by the lever's declared quality metric).
NUMERICS = ("exact", "reorders", "approximates")
PHASES = ("prefill", "decode")
# The model's named seams: where a lever (or a custom kernel) may replace the stock op.
SEAMS = ("norm", "add_norm", "qkv", "attn.decode", "attn.prefill", "o_proj", "gate_up", "down", "lm_head",
         "linear.gemv")
KERNEL_REF = re.compile(r"^(?:[\w./-]+\.py|[A-Za-z_][\w.]*):[A-Za-z_]\w*$")  # FILE.py:NAME or pkg.module:NAME
DEVICES = ("cuda", "cpu", "metal")  # device types: torch's CUDA and CPU; MLX's Metal, CUDA and CPU
BOTH = tuple(BACKENDS)  # levers with an applier on each backend
SLOW_WARMUP = 10.0  # seconds: a lever whose warm-up (compilation) takes longer is measured only when asked for


@dataclass(frozen=True)
class Clash:
    """Levers that cannot run beside the one declaring it (on `backends`, on `devices`), and why: checked both
    ways."""

    levers: tuple[str, ...]
    why: str
    backends: tuple[str, ...] = BOTH
    devices: tuple[str, ...] = DEVICES


@dataclass(frozen=True)
class Lever:
    """One row of the table. `choices` are the values `name=value` takes (empty: no value, or a free one
    checked by `value_pattern`); `quality` names the metric that judges a lever that approximates."""

    name: str
    question: str
    stage: str
    summary: str
    phases: tuple[str, ...] = PHASES
    numerics: str = "exact"
    seams: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()
    value_pattern: re.Pattern | None = None
    backends: tuple[str, ...] = ("torch",)
    devices: tuple[str, ...] = ("cuda", "cpu")
    quality: str | None = None
    architectures: tuple[str, ...] = ()  # the architectures whose layers it takes (empty: every one)
    requires: tuple[str, ...] = ()  # levers that must be on beside it
    clashes: tuple[Clash, ...] = ()
    warmup: tuple[tuple[str, float], ...] = ()  # (backend, seconds before its first timed run: compilation)
    gated: bool = False  # it routes attention to another path: worth trying only where the gate audit finds one
    needs_constraint: bool = False  # it acts only on a constrained workload (--choices/--regex/--json-schema)
    only: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (backend, the choices it takes) where it takes fewer
    own_values: bool = False  # it holds other weight values than the stock copy (quantized: the blocks' exact ones)

    def __post_init__(self) -> None:
        for field, value, allowed in (("question", self.question, QUESTIONS), ("stage", self.stage, STAGES),
                                      ("numerics", self.numerics, NUMERICS)):
            if value not in allowed:
                raise ValueError(f"lever {self.name}: {field} {value!r} not in {allowed}")
        if not set(self.phases) <= set(PHASES) or not set(self.seams) <= set(SEAMS):
            raise ValueError(f"lever {self.name}: phases {self.phases} / seams {self.seams} not all known")
        if (self.numerics == "approximates") != (self.quality is not None):
            raise ValueError(f"lever {self.name}: a quality metric is declared exactly when it approximates")
        if self.quality is not None:
            Quality.parse_all(self.quality)  # engine/quality.py: top1>=FRACTION, kl<=NATS, …
        if any(backend not in self.backends or seconds < 0 for backend, seconds in self.warmup):
            raise ValueError(f"lever {self.name}: warm-up {self.warmup}: expected (backend, seconds ≥ 0) pairs")

    def warmup_seconds(self, backend: str) -> float:
        """Seconds of warm-up (compilation) before its first timed run on `backend` (0: none worth naming)."""
        return dict(self.warmup).get(backend, 0.0)

    def slow_to_warm(self, backend: str) -> bool:
        """Its warm-up takes longer than SLOW_WARMUP on `backend`: measured only when the budget allows."""
        return self.warmup_seconds(backend) > SLOW_WARMUP

    @property
    def takes_value(self) -> bool:
        return bool(self.choices) or self.value_pattern is not None

    @property
    def usage(self) -> str:
        """How to write it: `graphs`, `compile=default|max-autotune-no-cudagraphs`, `kernel=pkg.module:NAME`."""
        if self.choices:
            return f"{self.name}={'|'.join(self.choices)}"
        return f"{self.name}=pkg.module:NAME" if self.value_pattern is not None else self.name


TABLE: tuple[Lever, ...] = (
    # model stage: changes to the model's modules, innermost first (sdpa_fold before sdpa_pad pads what it folds;
    # quantized before the packed levers, which then stack the blocks)
    # quantized: the same values as the dequantized stock weights (scale·q + bias rounds once, as llama.cpp's
    # dequantization does), summed in another order: it reorders, it does not approximate (backends/mlx/quant.py)
    Lever("quantized", "delete", "model", "GGUF Q4_0/Q4_1/Q8_0 weights kept as their blocks (MLX: "
          "mx.quantized_matmul; torch: a Triton GEMV for ≤ 16 rows on CUDA, the layers' projections; on the CPU "
          "torch's int4 matmul for a bf16 model, the output projection too): 4.5-8.5 bits read per weight instead "
          "of the dequantized 16-32", numerics="reorders",
          seams=("qkv", "o_proj", "gate_up", "down", "lm_head"), backends=BOTH, devices=DEVICES,
          clashes=(Clash(("compile",), "compile would trace its Triton GEMV", ("torch",)),), own_values=True),
    Lever("packed_qkv", "dispatch", "model", "q, k and v from one matmul instead of three", numerics="reorders",
          seams=("qkv",), backends=BOTH, devices=DEVICES),
    Lever("packed_gate_up", "dispatch", "model", "gate and up from one matmul instead of two", numerics="reorders",
          seams=("gate_up",), backends=BOTH, devices=DEVICES),
    # cpu_streams after the packed levers: it splits whatever projections they stacked
    Lever("cpu_streams", "fast-path", "model", "MLX on the CPU: every projection's output rows (the output head's "
          "too) split across one CPU stream per core, each part's product on its own thread (MLX runs a stream on one "
          "thread, and its CPU matmuls use no other)", seams=("qkv", "o_proj", "gate_up", "down", "lm_head"),
          backends=("mlx",), devices=("cpu",),
          clashes=(Clash(("compile",), "a compiled step would take the streams' ops into one trace", ("mlx",)),
                   Clash(("vocab_compact",), "it gathers rows of the output head this lever splits", ("mlx",)))),
    # int4mm after the packed levers: it repacks whatever blocks they stacked
    Lever("int4mm", "fast-path", "model", "quantized's Q4_0/Q4_1 projections through torch's int4 matmul "
          "(`_weight_int4pack_mm`, gpt-fast's tinygemm) at ≤ 16 rows instead of our Triton GEMV: the library's "
          "path first (bf16; its scales rounded to bf16 as the CPU's int4 path rounds them)", numerics="reorders",
          seams=("qkv", "o_proj", "gate_up", "down"), devices=("cuda",), requires=("quantized",)),
    # q8_dot after the packed levers too: it switches whatever block modules they left
    Lever("q8_dot", "kernel", "model", "quantized's decode row (M = 1) through an integer GEMV, as llama.cpp's "
          "MMVQ: x rounded to int8 per 32-value block (scale amax/127), each block's dot product summed in int32 by "
          "dp4a, one float multiply a block; instead of a float FMA per weight (beside fused_layer, inside its layer "
          "kernels, x rounded by one small kernel a GEMV)", phases=("decode",),
          # x's int8 rounding moves a projection's output ~0.5% (tests/test_q8_gemv.py); bounds not yet measured
          numerics="approximates", quality="ppl<=1.01,top1>=0.95",
          seams=("qkv", "o_proj", "gate_up", "down"), devices=("cuda",), requires=("quantized",),
          clashes=(Clash(("int4mm",), "both take the block projections' decode rows"),)),
    Lever("fused_norm", "fast-path", "model", "RMSNorm as one fused F.rms_norm call with its weight",
          numerics="reorders", seams=("norm",),
          architectures=("llama", "qwen2", "qwen3")),  # Gemma's norms scale by 1 + w, not by F.rms_norm's w
    Lever("sdpa_fold", "fast-path", "model", "one-token decode attention with each KV head's query heads folded "
          "into one block: no backend needs GQA support (efficient attention refuses it)", phases=("decode",),
          numerics="reorders", seams=("attn.decode",), gated=True),
    Lever("sdpa_pad", "fast-path", "model", "head_dim zero-padded to the nearest size a fused SDPA backend takes, "
          "when none takes the model's own", numerics="reorders", seams=("attn.decode", "attn.prefill"), gated=True),
    Lever("flex_decode", "fast-path", "model", "decode attention through compiled FlexAttention, whose decoding "
          "kernel splits the keys across the SMs (flash-decoding)", phases=("decode",), numerics="reorders",
          seams=("attn.decode",), devices=("cuda",),
          clashes=(Clash(("sdpa_fold",), "both replace decode attention"),), gated=True),
    Lever("sdpa_backend", "fast-path", "model", "attention tries the named SDPA backend first (the others stay as "
          "fallbacks); counted only for calls that backend can serve", numerics="reorders",
          seams=("attn.decode", "attn.prefill"), choices=("flash", "efficient", "cudnn", "math"), gated=True),
    Lever("sdpa_unfused", "fast-path", "model", "attention as matmul → softmax → matmul instead of "
          "mx.fast.scaled_dot_product_attention: what the fused kernel is worth where its gate takes the shape",
          numerics="reorders", seams=("attn.decode", "attn.prefill"), backends=("mlx",), devices=DEVICES, gated=True),
    Lever("sparse_v", "delete", "model", "decode attention skips the V rows whose softmax weight is below 1e-6 for "
          "every query head of their KV head (scores and softmax as usual, then a gather of the kept rows and their "
          "weighted sum; the fused Triton kernel is kernel=kerneltriage.kernels.sparse_v_attention:SPARSE_V)",
          phases=("decode",), numerics="approximates", seams=("attn.decode",),
          quality="maxlogit<=0.1,ppl<=1.001,greedy>=0.9",  # bounds: docs/sparse-v.md
          clashes=(Clash(("graphs", "compile"), "its gather's size depends on the weights (a host sync): no graph "
                         "captures it; the fused kernel keeps the skip inside one launch"),
                   Clash(("flex_decode", "sdpa_fold", "fused_layer"), "they replace decode attention too"))),
    Lever("fused_layer", "kernel", "model", "each layer's decode and verify rows (≤ 32) as six Triton kernels: "
          "norm → QKV → RoPE → cache write; split-KV attention; combine; o_proj → + residual; norm → gate_up → "
          "SiLU·mul; down → + residual (llama, qwen2, qwen3 layers; not under compile; beside quantized, decode rows "
          "read Q4_0/Q4_1 blocks in place on llama and qwen2)", phases=("decode",),
          numerics="reorders", seams=("norm", "qkv", "attn.decode", "o_proj", "gate_up", "down"), devices=("cuda",),
          architectures=("llama", "qwen2", "qwen3"),  # qwen2's q/k/v biases and qwen3's per-head q/k norms included
          clashes=(Clash(("compile",), "compile would trace its Triton kernels (graphs replays them)"),
                   Clash(("flex_decode", "sdpa_fold"), "its kernels attend themselves: theirs would not run"))),
    Lever("pdl", "dispatch", "model", "fused_layer's kernels launched with programmatic dependent launch: each "
          "requests its weights while the one before it finishes and waits only where it reads that one's output "
          "(compute capability 9.0+)", phases=("decode",), devices=("cuda",), requires=("fused_layer",)),
    Lever("kernel", "kernel", "model", "a custom kernel replaces the stock op at the seam it declares",
          numerics="reorders", value_pattern=KERNEL_REF, backends=BOTH, devices=DEVICES),
    # step stage: the functions that call the model
    Lever("last_logits", "delete", "step", "prefill computes the output projection for the last position only",
          phases=("prefill",), seams=("lm_head",), backends=BOTH, devices=DEVICES),
    Lever("compile", "dispatch", "step", "decode step (and verify) through torch.compile, or mx.compile on a static "
          "cache (MLX: default only)", phases=("decode",), numerics="reorders",
          choices=("default", "max-autotune-no-cudagraphs"), backends=BOTH, devices=DEVICES,
          only=(("mlx", ("default",)),),  # mx.compile has no modes
          warmup=(("torch", 60.0),)),  # inductor: 40-80 s per compilation of the default model on the H200
    Lever("compile_prefill", "dispatch", "step", "the prefill step through torch.compile, the prompt length "
          "dynamic: one compilation for every length, one call instead of an eager launch per op",
          phases=("prefill",), numerics="reorders", warmup=(("torch", 60.0),)),
    Lever("graphs", "dispatch", "step", "decode step (and verify) replayed from CUDA graphs (static cache, one "
          "graph per attention window)", phases=("decode",), numerics="reorders", devices=("cuda",)),
    Lever("prefill_graphs", "dispatch", "step", "the prefill replayed from CUDA graphs: the prompt padded to a "
          "multiple of 64 rows (one graph per bucket, captured on first use), the real last "
          "row's logits kept", phases=("prefill",), numerics="reorders", devices=("cuda",)),
    Lever("vocab_compact", "delete", "step", "under a constraint, a decode step whose allowed tokens are few (up "
          "to the measured crossover) computes only their rows of the output projection (gathered, one small GEMV), "
          "the rest -inf, instead of every row and a mask", phases=("decode",), numerics="reorders",
          seams=("lm_head",), backends=BOTH, devices=DEVICES, needs_constraint=True,
          clashes=(Clash(("compile",), "its step up to the output projection would run uncompiled"),
                   Clash(("quantized",), "MLX's quantized head keeps its rows in blocks, not rows to gather",
                         ("mlx",)))),
    # loop stage: the token loop around the steps
    Lever("one_sync", "dispatch", "loop", "one host readback per token; the next step is queued before it is read "
          "(MLX: mx.async_eval)", phases=("decode",), backends=BOTH, devices=DEVICES),
)
LEVERS: dict[str, Lever] = {lever.name: lever for lever in TABLE}
ORDER: dict[str, int] = {lever.name: index for index, lever in enumerate(TABLE)}


def _check_table() -> None:
    """Every lever a row requires or clashes with is a row of the table, and none requires one it clashes with."""
    for lever in TABLE:
        named = set(lever.requires) | {name for clash in lever.clashes for name in clash.levers}
        if not named <= set(LEVERS) or lever.name in named:
            raise ValueError(f"lever {lever.name}: requires/clashes name {sorted(named - set(LEVERS))} or itself")
        if set(lever.requires) & {name for clash in lever.clashes for name in clash.levers}:
            raise ValueError(f"lever {lever.name}: requires a lever it clashes with")


_check_table()


@dataclass(frozen=True)
class Place:
    """Where levers would run: the backend, the device type, the model's architecture and its named seams."""

    backend: str
    device_type: str
    arch: str
    seams: tuple[str, ...] = SEAMS
    constrained: bool = False  # the workload's output follows a constraint


def _clash(lever: Lever, other: str, place: Place) -> str | None:
    """Why `lever` cannot run beside `other` at `place`, by `lever`'s own row (None: it can)."""
    return next((clash.why for clash in lever.clashes if other in clash.levers and place.backend in clash.backends
                 and place.device_type in clash.devices), None)


def check_applies(place: Place, setting: "LeverSetting", on: tuple["LeverSetting", ...]) -> None:
    """An InputError when the lever table refuses it beside the levers `on` at `place` (backend, device, seams,
    architecture, requirements, clashes): what each backend's apply_config asks before a lever is applied."""
    why = refusal(setting, on, place)
    if why is not None:
        raise InputError(f"--levers {setting.text}: {why}")


def refusal(setting: "LeverSetting", on: tuple["LeverSetting", ...], place: Place) -> str | None:
    """Why `setting` cannot run beside the levers `on` at `place`, from the table alone (None: nothing in the table
    refuses it; its applier may still, for what only the device can say)."""
    lever = setting.lever
    if place.backend not in lever.backends:
        return f"runs on the {', '.join(lever.backends)} backend, not {place.backend}"
    if place.device_type not in lever.devices:
        return f"needs a {' or '.join(d.upper() for d in lever.devices)} device, not {place.device_type}"
    missing = [seam for seam in lever.seams if seam not in place.seams]
    if missing:
        return f"replaces the {', '.join(missing)} seam, which a {place.arch} model does not have"
    taken = dict(lever.only).get(place.backend)
    if taken is not None and setting.value not in taken:
        return f"takes {' or '.join(f'{lever.name}={choice}' for choice in taken)} on {place.backend}"
    if lever.needs_constraint and not place.constrained:
        return "acts only under a constraint (--choices, --regex or --json-schema)"
    if lever.architectures and place.arch not in lever.architectures:
        return f"takes {', '.join(lever.architectures)} layers, not {place.arch}'s"
    names = {s.name for s in on}
    absent = [name for name in lever.requires if name not in names]
    if absent:
        return f"needs {', '.join(absent)} on beside it"
    for other in sorted(names - {lever.name}):
        why = _clash(lever, other, place) or _clash(LEVERS[other], lever.name, place)
        if why:
            return f"not with {other}: {why}"
    return None


@dataclass(frozen=True)
class LeverSetting:
    """One lever switched on, with its value where it takes one: `compile=default`, `graphs`."""

    lever: Lever
    value: str | None = None

    def __post_init__(self) -> None:
        lever, value = self.lever, self.value
        if not lever.takes_value and value is not None:
            raise ValueError(f"lever {lever.name} takes no value, got {value!r}")
        if lever.choices and value not in lever.choices:
            raise ValueError(f"lever {lever.name}={value}: expected one of {', '.join(lever.choices)}")
        if lever.value_pattern is not None and not (value and lever.value_pattern.match(value)):
            raise ValueError(f"lever {lever.name}={value}: expected {lever.usage}")

    @property
    def name(self) -> str:
        return self.lever.name

    @property
    def text(self) -> str:
        return self.name if self.value is None else f"{self.name}={self.value}"

    def __str__(self) -> str:
        return self.text


def parse_setting(text: str) -> LeverSetting:
    """`graphs` or `compile=default` → a LeverSetting; anything else is an InputError naming what is known."""
    name, sep, value = text.strip().partition("=")
    lever = LEVERS.get(name.strip())
    if lever is None:
        known = ", ".join(lever.usage for lever in TABLE)
        raise InputError(f"unknown lever {text.strip()!r}; expected some of {known}")
    if lever.takes_value and not sep:
        raise InputError(f"lever {lever.name}: expected {lever.usage}")
    try:
        return LeverSetting(lever, value.strip() if sep else None)
    except ValueError as exc:
        raise InputError(str(exc)) from None


def parse_levers(text: str | None) -> tuple[LeverSetting, ...]:
    """`a,b` → settings in the table's composition order; empty → (); a lever named twice is an InputError."""
    settings = [parse_setting(part) for part in (text or "").split(",") if part.strip()]
    names = [s.name for s in settings if s.name != "kernel"]  # several kernels may each take a seam
    if len(set(names)) != len(names):
        raise InputError(f"levers {text!r}: a lever is named twice")
    return ordered(settings)


def ordered(settings: list[LeverSetting] | tuple[LeverSetting, ...]) -> tuple[LeverSetting, ...]:
    """Settings in the table's row order: the order they are applied in, whatever order they were named in."""
    return tuple(sorted(settings, key=lambda s: ORDER[s.name]))


def changes_numerics(settings: tuple[LeverSetting, ...]) -> bool:
    """True when any of the settings computes with other kernels or shapes than stock."""
    return any(s.lever.numerics != "exact" for s in settings)


HELP_WIDTH = 79  # --help stays readable at 80 columns: each entry wraps under itself, no word is cut


def help_table() -> str:
    """One entry per lever for `--help`: how to write it, its question (and its backend when only one has it),
    what it does."""
    tag = lambda lever: lever.question + ("" if lever.backends == BOTH else f", {'/'.join(lever.backends)} only")  # noqa: E731
    return "\n".join(textwrap.fill(f"{lever.usage}  [{tag(lever)}] {lever.summary}", HELP_WIDTH,
                                   initial_indent="  ", subsequent_indent="      ", break_long_words=False)
                      for lever in TABLE)
