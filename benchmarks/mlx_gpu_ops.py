"""Ops per decode step as a GPU builds them, ours beside mlx-lm's (issue 15): the CPU graph's primitives, with every
mx.fast call (lowered to composed ops on the CPU) counted as one primitive, and views left out.

    PYTHONPATH=src:tests python benchmarks/mlx_gpu_ops.py [float32|float16] [levers]

Pass 1 counts the whole step's graph; pass 2 evaluates each fast call's inputs first, so what the call lowered to
is counted alone and replaced by one. A diagnostic; float16 on the CPU takes minutes.
"""
import sys
import mlx.core as mx
sys.path.insert(0, "benchmarks")
from mlx_step_probe import op_counts, Ours, Theirs, checkpoint_of
from kerneltriage.backends.mlx.backend import BACKEND
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.peers.mlxlm import load_gguf_model

dtype = sys.argv[1] if len(sys.argv) > 1 else "float16"
levers = sys.argv[2] if len(sys.argv) > 2 else "quantized"
ck = checkpoint_of("default")
prompt = [(7 * i + 3) % ck.config.vocab_size for i in range(64)]
runner = BACKEND.build(ck, RunConfig.from_flags(levers), "cpu", dtype)
engines = {"ours": Ours(runner, prompt), "mlx-lm": Theirs(load_gguf_model(ck, getattr(mx, dtype)), prompt)}
FAST = ("rms_norm", "rope", "scaled_dot_product_attention", "layer_norm")
originals = {n: getattr(mx.fast, n) for n in FAST}
lowered = []
def wrap(name):
    def call(*args, **kwargs):
        mx.eval([a for a in args if isinstance(a, mx.array)] + [v for v in kwargs.values() if isinstance(v, mx.array)])
        out = originals[name](*args, **kwargs)
        lowered.append((name, op_counts(out)))
        return out
    return call
for label, e in engines.items():
    total = op_counts(e.build()); mx.eval(e.token)
    for n in FAST: setattr(mx.fast, n, wrap(n))
    lowered.clear(); e.build(); mx.eval(e.token)
    for n in FAST: setattr(mx.fast, n, originals[n])
    calls = {}
    for n, c in lowered: calls[n] = calls.get(n, 0) + 1
    gpu = total.copy()
    for n, c in lowered:
        gpu.subtract(c)
        gpu[n] += 1
    VIEWS = {"Broadcast", "Reshape", "Slice", "Transpose", "ExpandDims", "Squeeze", "Flatten", "Unflatten"}
    kernels = {k: v for k, v in gpu.items() if v > 0 and k not in VIEWS}
    print(f"{label} ({dtype}, {levers}): CPU graph {sum(total.values())} ops; as on a GPU {sum(v for v in gpu.values() if v > 0)} ops, "
          f"{sum(kernels.values())} not views: {dict(sorted(kernels.items(), key=lambda kv: -kv[1]))}")
