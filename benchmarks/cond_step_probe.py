"""Can the device choose a plain step or a verify inside one CUDA graph, and what does the choice cost? CUDA only; no
model file (the default model's shapes, random weights, the fused set with PDL).

Why: a resident speculative loop still waits for the host at every verify that did not accept its whole draft and at
every switch between plain steps and verifies (~0.15 plain steps each on the H200: the replay with
`--host-gap 0.15` gives repetitive 2.75×, as measured), and a pipelined plain run verifies one token late. A graph
whose draft kernel sets the value a CUDA conditional (SWITCH) node reads would let the host queue steps without
deciding them. This probe captures one graph with a SWITCH node of two bodies (a plain step's forward and argmax, a
16-row verify's) around the fused set's Triton kernels and times its replays against the plain and verify graphs
alone.

    python3 benchmarks/cond_step_probe.py --out cond-step.json

benchmarks/results/cond-step-smollm2-preset-h200.json came from its first version, which built the same SWITCH node
inline (the code that became backends/torch/graph_switch.py, used here since).
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from kerneltriage.backends.torch import graph_switch
from kerneltriage.backends.torch.backend import BACKEND
from kerneltriage.core.environment import capture_environment
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.sources import load_checkpoint

from verify_tiles_probe import FUSED, POSITION, queued_us

ROUNDS, ITERS = 7, 200


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--out", default="cond-step.json")
    args = parser.parse_args()
    result: dict = {"benchmark": "cond-step", "model": args.model, "position": POSITION,
                    "torch": torch.__version__, "environment": capture_environment()}
    runner = BACKEND.build(load_checkpoint(args.model), RunConfig.from_flags(FUSED), "cuda", "bfloat16")
    runner.reset_cache(POSITION + 64)
    runner.prefill(list(range(1, POSITION + 1)), 0)
    model, cache = runner.model, runner.model.cache
    decode, verify = runner.decode_step.step, runner.verify_step.step  # the graphed steps' own functions
    drafts = list(range(7, 22))
    plain = lambda: runner.decode(3, POSITION)  # noqa: E731
    verify16 = lambda: runner.verify(3, drafts, POSITION, 16)  # noqa: E731
    want_plain, want_verify = int(plain().argmax()), verify16().argmax(-1).tolist()

    slot = torch.tensor([[3, *drafts]], device="cuda")
    choice = torch.zeros((), dtype=torch.int32, device="cuda")
    out = torch.zeros(17, dtype=torch.long, device="cuda")
    bodies = (lambda: decode(model, slot[:, :1], POSITION).argmax(-1).view(-1),
              lambda: verify(model, slot, POSITION).argmax(-1))

    def body(index: int) -> None:
        best = bodies[index]()
        out[1:1 + len(best)].copy_(best)
        out[:1].fill_(len(best))

    from kerneltriage.backends.torch.accelerate import _capturable_attention
    from kerneltriage.backends.torch.cudagraph import capture
    cache.position.fill_(POSITION)
    cache.window = runner.decode_step.window(cache, POSITION + 16)
    try:
        with _capturable_attention():
            # each body its own torch graph (its own pool), kept as a cudaGraph_t
            children = [capture(lambda index=index: body(index), 2, keep_graph=True)[0] for index in range(2)]
            graph = graph_switch.switch_graph(lambda: None, choice, children)
    finally:
        cache.window = None
    found = result["checks"] = {}
    for name, setting, want in (("plain", 0, [1, want_plain]), ("verify16", 1, [16, *want_verify])):
        choice.fill_(setting)
        out.zero_()
        graph.replay()
        got = out[:len(want)].tolist()
        found[name] = {"ok": got == want, "got": got[:4], "want": want[:4]}
        print(name, found[name], flush=True)
    times = result["queued_us"] = {"plain": [], "verify16": [], "cond_plain": [], "cond_verify16": [], "cond_none": []}
    for i in range(ROUNDS):
        times["plain"].append(queued_us(plain, ITERS))
        times["verify16"].append(queued_us(verify16, ITERS))
        for name, setting in (("cond_plain", 0), ("cond_verify16", 1), ("cond_none", 2)):
            choice.fill_(setting)
            times[name].append(queued_us(graph.replay, ITERS))
        print("round", i, {k: round(v[-1], 1) for k, v in times.items()}, flush=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    result["median_us"] = {k: statistics.median(v) for k, v in times.items()}
    print("median", {k: round(v, 1) for k, v in result["median_us"].items()}, flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
