"""Does MLX_ENABLE_TF32 change mlx-lm's float16 decode? Issue 15's second H200 run found our MLX decode and mlx-lm's
both about halved against the first (236 → 116 and 373 → 202 tok/s) while torch's did not; our backend now sets
MLX_ENABLE_TF32=0 for the whole process (its float32 reference), which MLX documents as affecting float32 only.
One process per setting (MLX reads it once):

    MLX_ENABLE_TF32=1 python3 benchmarks/mlx_tf32_probe.py >> out.jsonl
    MLX_ENABLE_TF32=0 python3 benchmarks/mlx_tf32_probe.py >> out.jsonl

mlx-lm's model over the default GGUF's blocks, float16, called as `bench --peers mlx-lm` calls it: 128 greedy tokens after
a 16-token prompt (argv[1] tokens instead of 128) through mlx-lm's own generate_step; tokens / wall time with that
prefill inside, the median of 5 runs after one warm-up.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

RUNS = 5


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 128  # fewer on a CPU (~7 tok/s there)
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache

    from kerneltriage.engine.sources import load_checkpoint
    from kerneltriage.peers.mlxlm import load_gguf_model

    # float16 as on the H200 run; float32 on a CPU, where MLX's float16 arithmetic is emulated (minutes a token)
    dtype = mx.float16 if mx.default_device() == mx.gpu else mx.float32
    model = load_gguf_model(load_checkpoint("default"), dtype)
    prompt = mx.array(list(range(100, 116)))
    rates = []
    for _ in range(RUNS + 1):
        start = time.perf_counter()
        count = sum(1 for _ in generate_step(prompt, model, max_tokens=steps, prompt_cache=make_prompt_cache(model),
                                             sampler=lambda logits: mx.argmax(logits, axis=-1)))
        rates.append(count / (time.perf_counter() - start))
    print(json.dumps({"MLX_ENABLE_TF32": os.environ.get("MLX_ENABLE_TF32"), "device": str(mx.default_device()),
                      "dtype": str(dtype),
                      "tok_s": statistics.median(rates[1:]), "runs": rates[1:]}))


if __name__ == "__main__":
    main()
