"""Token-tree verify on a torch runner: one forward over the root (the last emitted token) and the tree's nodes,
then the accepted branch's cache entries moved into place (engine/speculative/tree.py has the tree and the walk).

The forward writes row r (node r) into cache slot start + r, but gives it RoPE position start + depth(r) and a
mask row that sees the cache prefix (slots < start), its ancestors and itself: each row computes exactly what
a linear verify of its own path would. A sibling branch's slots are masked, so they never leak into a row.
After acceptance, the kept path's entries (slots start + node) are gathered to start + 1, start + 2, … — the
positions their RoPE already encodes — and the cache is trimmed past them.
"""

from __future__ import annotations

import torch

from kerneltriage.backends.torch.cache import KVCache, Positions
from kerneltriage.engine.speculative.tree import TokenTree


def tree_mask(tree: TokenTree, start: int, device: torch.device) -> torch.Tensor:
    """(N+1, start+N+1) bool, True = may attend: every row sees the prefix, its ancestors and itself."""
    rows = tree.size + 1
    lineage = torch.zeros(rows, rows, dtype=torch.bool)
    for row in range(rows):
        lineage[row, tree.lineage(row)] = True
    prefix = torch.ones(rows, start, dtype=torch.bool)
    return torch.cat([prefix, lineage], dim=1).to(device)


class TreeCache:
    """The runner's cache as one tree forward sees it: the same slots and writes, but positions by depth and
    the tree mask (the model reads both from `positions`; nothing in the model changes)."""

    def __init__(self, cache: KVCache, tree: TokenTree, start: int) -> None:
        self.cache = cache
        device = cache.keys.device
        self.ids = start + torch.tensor(tree.depths(), device=device)  # (N+1,) RoPE positions
        self.mask = tree_mask(tree, start, device)

    def positions(self, start: int, count: int) -> Positions:
        self.cache.positions(start, count)  # checks the room and marks slots start…start+N filled
        return Positions(start, self.ids, self.mask)

    def update(self, layer: int, pos: Positions, k: torch.Tensor, v: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cache.update(layer, pos, k, v)


def keep_branch(cache: KVCache, start: int, path: list[int]) -> None:
    """Keep the root and the accepted `path` (nodes) in the cache: node path[i]'s entries (slot start + node)
    move to slot start + 1 + i in every layer; everything past them is forgotten."""
    if path:
        source = torch.tensor(path, device=cache.keys.device) + start
        target = torch.arange(1, len(path) + 1, device=cache.keys.device) + start
        # the gathered right-hand side is a copy, so a target slot that is also a source is read first
        cache.keys[:, :, :, target] = cache.keys[:, :, :, source]  # (L, B, Hkv, n, D)
        cache.values[:, :, :, target] = cache.values[:, :, :, source]
    cache.trim(start + 1 + len(path))
