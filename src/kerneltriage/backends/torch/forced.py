"""Teacher-forced logits on the host: what `ab`'s correctness check compares, through the runner's own steps."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

if TYPE_CHECKING:
    from kerneltriage.backends.torch.runner import Runner


@torch.inference_mode()
def forced_logits(runner: "Runner", prompt: Sequence[int], fed: Sequence[int] | None, count: int
                  ) -> tuple[np.ndarray, list[int]]:
    """Float32 logits (count, V) after the prompt and after each of the tokens `fed` (None: the runner's own
    greedy tokens), and the tokens fed. A speculating runner takes them through its verify forward, its deepest
    k+1 rows at a time (padded like its own loop pads), so the path its speculation runs is the one checked; the
    others through their decode step."""
    runner.reset_cache(len(prompt) + count)
    rows = [runner.prefill(prompt, 0)[0].float()]
    position, fed = len(prompt), list(fed or [])[: count - 1]
    block = runner.speculation.controller.deepest + 1 if runner.speculation else 0
    if block and len(fed) < count - 1:
        raise ValueError("a speculating runner is checked on the reference's tokens: pass them")
    pad = runner.speculation.rows(runner) if runner.speculation else 0
    while len(rows) < count:
        done = len(rows) - 1  # tokens fed so far
        if block:
            chunk = fed[done:done + block]
            rows += list(runner.verify(chunk[0], chunk[1:], position + done, pad).float())
            runner.trim_cache(position + done + len(chunk))
            continue
        if done == len(fed):  # no token given: the runner's own greedy one
            fed.append(int(rows[-1].argmax()))
        rows.append(runner.decode(fed[done], position + done)[0].float())
    return torch.stack(rows).cpu().numpy(), fed
