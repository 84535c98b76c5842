"""The `q8_dot` lever (kernels/q8_gemv.py, backends/torch/quantized.py): the integer GEMV's dp4a equals an int8 dot
product, its output is the blocks' exact product but for x's int8 rounding (a bound a wrong nibble order breaks),
its GPU build issues dp4a, and the lever takes a quantized model's decode rows. On a machine without CUDA the kernel
runs in Triton's interpreter (conftest), its dp4a as arithmetic; on CUDA compiled, with the PTX instruction too."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kerneltriage.core.errors import InputError
from kerneltriage.engine.levers import LEVERS, LeverSetting, Place, refusal

pytest.importorskip("triton")
import triton  # noqa: E402 - after the skip
import triton.language as tl  # noqa: E402

from kerneltriage.kernels import q8_gemv as q8  # noqa: E402
from kerneltriage.kernels.quant_gemv import KINDS, QuantWeight, Tiles, nibbles, quant_gemv  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.gpu  # in the GPU suite too: on CUDA its kernels run compiled (here, in the interpreter)
N, K = 37, 576  # a ragged tile of rows; the default model's width, 18 blocks: no multiple of a step's blocks


@triton.jit
def _dp4a_kernel(a_ptr, b_ptr, c_ptr, out_ptr, ASM: tl.constexpr):
    i = tl.arange(0, 256)
    tl.store(out_ptr + i, q8.dp4a(tl.load(a_ptr + i), tl.load(b_ptr + i), tl.load(c_ptr + i), ASM))


@pytest.mark.parametrize("asm", [False, True] if q8.ASM else [False])
def test_dp4a_is_the_int8_dot_product_of_the_words_bytes(asm: bool) -> None:
    rng = np.random.default_rng(0)
    a, b = (rng.integers(-2**31, 2**31, 256, dtype=np.int64).astype(np.int32) for _ in range(2))
    c = rng.integers(-2**20, 2**20, 256).astype(np.int32)
    want = c + (a.view(np.int8).reshape(256, 4).astype(np.int32) * b.view(np.int8).reshape(256, 4)).sum(1)
    out = torch.empty(256, dtype=torch.int32, device=DEVICE)
    _dp4a_kernel[(1,)](*(torch.from_numpy(v).to(DEVICE) for v in (a, b, c)), out, ASM=asm)
    assert np.array_equal(out.cpu().numpy(), want)


def _blocks(qtype: str, n: int = N, k: int = K, seed: int = 0) -> QuantWeight:
    """Random blocks: scales 0.01–0.05 (Q4_1's mins −0.4–0), every quant byte value."""
    rng = np.random.default_rng(seed)
    scales = torch.from_numpy(rng.uniform(0.01, 0.05, (n, k // 32)).astype(np.float16))
    mins = torch.from_numpy(rng.uniform(-0.4, 0, (n, k // 32)).astype(np.float16)) if qtype == "Q4_1" else None
    quants = torch.from_numpy(rng.integers(0, 256, (n, k if qtype == "Q8_0" else k // 2), dtype=np.uint8))
    quants = quants.view(torch.int8) if qtype == "Q8_0" else quants
    return QuantWeight(qtype, scales.to(DEVICE), None if mins is None else mins.to(DEVICE), quants.to(DEVICE), (n, k))


def _values(w: QuantWeight, swapped: bool = False) -> np.ndarray:
    """The weight's values (N, K/32, 32) in float64; `swapped`: a Q4 block's halves read the wrong way round."""
    n = w.shape[0]
    d = w.scales.cpu().double().numpy()[..., None]
    if w.qtype == "Q8_0":
        return w.quants.cpu().view(n, -1, 32).double().numpy() * d
    q = nibbles(w.quants.cpu(), n).double().numpy()
    q = np.concatenate([q[..., 16:], q[..., :16]], -1) if swapped else q
    return d * q + w.mins.cpu().double().numpy()[..., None] if w.qtype == "Q4_1" else d * (q - 8)


def _rounding_bound(x: np.ndarray, values: np.ndarray) -> np.ndarray:
    """(N,) the most x's int8 rounding can move each output: |x − dx·xq| ≤ dx/2 a value, dx = a block's amax/127,
    so a block's sum moves by at most dx/2·Σ|w| (Q4_0: d·dx/2·Σ|q − 8|)."""
    dx = np.abs(x.reshape(-1, 32)).max(1) / 127  # (K/32,)
    return (np.abs(values).sum(-1) * dx / 2).sum(-1)


def _llama_cpp(x: np.ndarray, w: QuantWeight) -> np.ndarray:
    """(N,) llama.cpp's sum: x (K,) float32 rounded to int8 per block (half away from zero), the products in
    integers, a block's scale once."""
    blocks = x.reshape(-1, 32)
    amax = np.abs(blocks).max(1, keepdims=True)
    v = blocks * (np.float32(127) / np.maximum(amax, np.float32(1e-30)))
    xq = np.trunc(v + np.where(v >= 0, 0.5, -0.5)).astype(np.int64)  # (K/32, 32)
    dx, d = amax[:, 0].astype(np.float64) / 127, w.scales.cpu().double().numpy()  # (K/32,), (N, K/32)
    q = w.quants.cpu().view(w.shape[0], -1, 32).long().numpy() if w.qtype == "Q8_0" else \
        nibbles(w.quants.cpu(), w.shape[0]).long().numpy()
    dots, sums = (q * xq).sum(-1), xq.sum(-1)  # (N, K/32), (K/32,)
    if w.qtype == "Q4_1":
        return ((d * dots + w.mins.cpu().double().numpy() * sums) * dx).sum(-1)
    return (d * dx * (dots - 8 * sums if w.qtype == "Q4_0" else dots)).sum(-1)


@pytest.mark.parametrize("values", [8192, 1024])  # one step over K's 18 blocks; 4 blocks a step, the last ragged
@pytest.mark.parametrize("qtype", list(KINDS))
def test_the_integer_gemv_is_the_exact_product_but_for_xs_rounding(qtype: str, values: int,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(q8, "TILES", Tiles(values=values))
    w = _blocks(qtype)
    x = torch.randn(1, K, generator=torch.Generator().manual_seed(1))
    x[0, 32:64] = 0  # an all-zero block: dx = 0
    got = q8.q8_gemv(x.to(DEVICE), w).cpu().double().numpy()[0]
    xs, exact = x.double().numpy()[0], _values(w)
    want = exact.reshape(N, K) @ xs
    slack = 1e-5 * (np.abs(exact).reshape(N, K) @ np.abs(xs))  # float32 sums of the block products
    bound = _rounding_bound(xs, exact)
    assert np.all(np.abs(got - want) <= bound + slack)
    assert np.all(np.abs(got - _llama_cpp(x.numpy()[0], w)) <= slack)  # its rounding, to the float sums' order
    assert np.abs(got - want).max() > 1e-3 * np.abs(want).max()  # rounded, not x's float values
    if qtype != "Q8_0":  # the bound holds a Q4 block's halves to their places: swapped, most rows fall outside it
        wrong = _values(w, swapped=True).reshape(N, K) @ xs
        assert np.mean(np.abs(wrong - want) > bound + slack) > 0.8
    float_gemv = quant_gemv(x.to(DEVICE), w).cpu().double().numpy()[0]
    assert np.linalg.norm(got - float_gemv) < 0.02 * np.linalg.norm(float_gemv)


def test_the_gemv_keeps_the_activations_dtype() -> None:
    x = torch.randn(1, K, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    w = _blocks("Q4_0", seed=3)
    got = q8.q8_gemv(x, w)
    assert got.dtype == torch.bfloat16 and got.shape == (1, N)
    want = _values(w).reshape(N, K) @ x.float().cpu().double().numpy()[0]
    assert np.linalg.norm(got.cpu().double().numpy()[0] - want) < 0.02 * np.linalg.norm(want)


# The GPU build, which the interpreter never runs: compiled for sm_90 on this machine (Triton's bundled ptxas and
# nvdisasm), pointers and sizes 16-divisible as a launch on an 8B's q_proj (4,096 × 4,096) specializes them. Apart from
# this process (conftest's interpreter).
SM90_BUILD = """
import re, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.tools.disasm import get_sass
from kerneltriage.kernels.q8_gemv import ASM, TILES, _q8_gemv
from kerneltriage.kernels.quant_gemv import KINDS, launch

assert ASM
names = _q8_gemv.arg_names
for qtype, kind in KINDS.items():
    bn, bb = launch(4096, 128, 1, TILES)
    consts = {"KIND": kind, "BN": bn, "BB": bb, "NBLOCKS": 128, "STAGES": TILES.stages, "ASM": True}
    sig = {n: "constexpr" if n in consts else "*i32" if n in ("q_ptr", "xw_ptr", "xs_ptr") else "*fp32" if n ==
           "dx_ptr" else "*fp16" if n in ("scale_ptr", "min_ptr") else "*bf16" if n.endswith("_ptr") else "i32"
           for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if sig[n] != "constexpr"}
    kernel = triton.compile(ASTSource(_q8_gemv, signature=sig, constexprs=consts, attrs=attrs),
                            target=GPUTarget("cuda", 90, 32), options={"num_warps": TILES.warps})
    ptx = kernel.asm["ptx"]
    wide = len(re.findall(r"ld\\.global\\.v4|cp\\.async\\.cg\\.shared\\.global [^;]*, 0x10,", ptx))
    print(qtype, ptx.count("dp4a.s32.s32"), get_sass(kernel.asm["cubin"]).count("IDP.4A"), wide,
          ptx.count("cp.async"))
"""


def test_the_gemv_builds_for_sm90_with_dp4a() -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRITON_INTERPRET": "0"}
    done = subprocess.run([sys.executable, "-c", SM90_BUILD], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines] == list(KINDS)
    for line in lines:
        _, ptx, sass, wide, copies = line.split()
        assert int(ptx) > 0 and int(sass) > 0, line  # the instruction, not its arithmetic stand-in
        assert int(wide) > 0, line  # the blocks' words in 16-byte transfers
        # x's words loaded by every row's threads through L1: no asynchronous copies (they bypass L1, and each
        # row's copy of x went to L2: 8.8× slower on an 8B's q_proj)
        assert int(copies) == 0, line


def test_the_table_keeps_it_to_cuda_beside_quantized_alone() -> None:
    cuda = Place("torch", "cuda", "llama")
    on = lambda *names: tuple(LeverSetting(LEVERS[name]) for name in names)  # noqa: E731
    setting = LeverSetting(LEVERS["q8_dot"])
    assert refusal(setting, on("quantized", "q8_dot"), cuda) is None
    assert refusal(setting, on("q8_dot"), cuda) == "needs quantized on beside it"
    assert refusal(setting, on("quantized", "q8_dot"), Place("torch", "cpu", "llama")) == \
        "needs a CUDA device, not cpu"
    assert "not with int4mm" in refusal(setting, on("quantized", "int4mm", "q8_dot"), cuda)
    assert refusal(setting, on("quantized", "fused_layer", "q8_dot"), cuda) is None  # inside its layer kernels


def test_the_lever_takes_a_quantized_models_decode_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Applied directly (on the CPU too: the interpreter): every block projection's decode row through the integer
    GEMV, counted; the logits those of the float GEMV but for x's rounding. Off CUDA the table refuses it in a line."""
    pytest.importorskip("gguf.quants")
    from test_quant_gemv import _quantized, _quantized_checkpoint, _runner

    from kerneltriage.backends.torch import levers
    from kerneltriage.kernels import quant_gemv

    for module in (q8, quant_gemv):  # a program for all of a projection's rows: the interpreter runs them in turn
        monkeypatch.setattr(module, "TILES", Tiles(bn=128))
    checkpoint = _quantized_checkpoint("Q4_0")
    if DEVICE == "cpu":
        with pytest.raises(InputError, match=r"^--levers q8_dot: needs a CUDA device, not cpu$"):
            _runner(checkpoint, "quantized,q8_dot")
    float_gemv, integer = _quantized(_runner(checkpoint)), _quantized(_runner(checkpoint))
    levers.APPLIERS["q8_dot"](integer, None)
    prompt = list(range(5, 25))  # more rows than a GEMV takes: the prompt dequantizes
    for runner in (float_gemv, integer):
        runner.reset_cache(32)
        runner.prefill(prompt, 0)
    a, b = (runner.decode(7, len(prompt)).float() for runner in (float_gemv, integer))
    assert integer.counters["q8_dot"] == 2 * 7 and not float_gemv.counters["q8_dot"]  # 2 layers × 7, one step
    assert 0 < (b - a).norm() < 0.05 * a.norm()
    with pytest.raises(InputError, match="no projection is kept as blocks"):
        levers.APPLIERS["q8_dot"](_runner(checkpoint), None)
