"""Teacher-forced logits on the host: what `ab`'s correctness check compares, through the runner's own steps."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def forced_logits(runner: Any, prompt: Sequence[int], fed: Sequence[int] | None, count: int
                  ) -> tuple[np.ndarray, list[int]]:
    """Float32 logits (count, V) after the prompt and after each of the tokens `fed` (None: the runner's own
    greedy tokens), and the tokens fed. A speculating runner takes them through its verify forward, a block of
    each of its padded shapes in turn (unpadded: its deepest k+1 rows at a time), so the paths its speculation runs
    are the ones checked; the others through their decode step."""
    if fed is not None and len(fed) >= count - 1 and _stock(runner):
        return _one_forward(runner, prompt, list(fed)[: count - 1]), list(fed)[: count - 1]
    runner.reset_cache(len(prompt) + count)
    rows = [runner.host_logits(runner.prefill(prompt, 0)[0])]
    position, fed = len(prompt), list(fed or [])[: count - 1]
    blocks = _verify_blocks(runner)
    if blocks and len(fed) < count - 1:
        raise ValueError("a speculating runner is checked on the reference's tokens: pass them")
    while len(rows) < count:
        done = len(rows) - 1  # tokens fed so far
        if blocks:
            size, pad = blocks[0]
            blocks.append(blocks.pop(0))  # each verify shape in turn
            chunk = fed[done:done + size]
            rows += list(runner.host_logits(runner.verify(chunk[0], chunk[1:], position + done, pad)))
            runner.trim_cache(position + done + len(chunk))
            continue
        if done == len(fed):  # no token given: the runner's own greedy one
            fed.append(int(rows[-1].argmax()))
        rows.append(runner.host_logits(runner.decode(fed[done], position + done)[0]))
    return np.stack(rows), fed


def _verify_blocks(runner: Any) -> list[tuple[int, int]]:
    """(tokens, padded rows) of each verify a speculating runner's check takes in turn: every padded shape its loop
    may use, full; unpadded, the deepest k + 1 unpadded. None speculating: []."""
    decoder = runner.speculation
    if decoder is None:
        return []
    return [(rows, rows) for rows in decoder.shapes(runner)] or [(decoder.deepest(runner) + 1, 0)]


def _stock(runner: Any) -> bool:
    """No lever and no speculation: the runner's steps are the model's own forward."""
    return not runner.run_config.levers and runner.speculation is None


def _one_forward(runner: Any, prompt: Sequence[int], fed: list[int]) -> np.ndarray:
    """A stock runner's teacher-forced logits in one causal forward over prompt + fed: the same function as
    its decode steps, computed at once (a reference over 300 positions costs one pass, not 300 eager steps)."""
    tokens = list(prompt) + fed
    runner.reset_cache(len(tokens))
    return runner.host_logits(runner.model(runner.tensor(tokens), 0)[0, len(prompt) - 1:])  # (len(fed) + 1, V)
