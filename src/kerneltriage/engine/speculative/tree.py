"""A token tree: several candidate continuations merged (shared prefixes once), verified in one forward.

Nodes are numbered 1..N in insertion order; node 0 is the root, the last emitted token (already decided, not a
draft). Every node's parent has a smaller number, so a row of the verify forward only attends to rows before it
and a node's ancestors are found by following `parents` down to 0. The verify forward's row r holds node r:
position start + depth(r), and it sees the cache prefix, its ancestors and itself, never a sibling's branch.

Greedy acceptance walks the tree: at a node, the target's argmax (its row's prediction) is compared with the
node's children; a child with that token is kept and the walk goes on from it; the first node with no such
child ends the walk, and its argmax is the bonus token. Every kept token equals the argmax after the tokens
before it on its path, so the emitted tokens are exactly what plain greedy decoding emits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

DEFAULT_TREE_NODES = 16  # nodes one tree verifies (drafted tokens, the root not counted)


@dataclass(frozen=True)
class TokenTree:
    """`tokens[i]` is node i+1's token, `parents[i]` node i+1's parent (0: the root)."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError(f"{len(self.tokens)} tokens, {len(self.parents)} parents: expected one parent each")
        if any(not 0 <= parent <= node for node, parent in enumerate(self.parents)):
            raise ValueError(f"parents={self.parents}: expected each node's parent numbered before it")

    @property
    def size(self) -> int:
        return len(self.tokens)

    def parent(self, node: int) -> int:
        return self.parents[node - 1]

    def depths(self) -> list[int]:
        """Depth of every row, the root's (0) first."""
        depths = [0]
        for parent in self.parents:
            depths.append(depths[parent] + 1)
        return depths

    @property
    def depth(self) -> int:
        """The longest path's length (drafted tokens on it)."""
        return max(self.depths())

    def lineage(self, node: int) -> list[int]:
        """Rows `node` attends to among the tree's: its ancestors, the root included, and itself."""
        rows = [node]
        while node:
            node = self.parent(node)
            rows.append(node)
        return rows[::-1]

    def children(self, node: int) -> dict[int, int]:
        """token → child node, for the children of `node`."""
        return {self.tokens[i]: i + 1 for i, parent in enumerate(self.parents) if parent == node}

    def first_path(self) -> list[int]:
        """The tokens of the first candidate's path (each node's first child): what a linear draft proposes."""
        tokens, node = [], 0
        while children := self.children(node):
            node = min(children.values())
            tokens.append(self.tokens[node - 1])
        return tokens

    def walk(self, best: Sequence[int]) -> list[int]:
        """The accepted path (nodes, root excluded) given the target's argmax `best` per row (greedy)."""
        path, node = [], 0
        while (child := self.children(node).get(best[node])) is not None:
            path.append(child)
            node = child
        return path


def merge(candidates: Sequence[Sequence[int]], budget: int) -> TokenTree | None:
    """Candidate continuations merged into a tree of at most `budget` nodes (None when empty). Nodes are added
    level by level (every candidate's first token, then every second token, ...), so the budget is spread over
    the branches rather than spent on the first one; a prefix already in the tree is shared."""
    tokens: list[int] = []
    parents: list[int] = []
    edges: dict[tuple[int, int], int] = {}  # (parent, token) → node
    at = [0] * len(candidates)  # per candidate: the node its prefix so far ends at
    for level in range(max(map(len, candidates), default=0)):
        for i, candidate in enumerate(candidates):
            if level >= len(candidate):
                continue
            edge = (at[i], candidate[level])
            if edge not in edges:
                if len(tokens) == budget:
                    return TokenTree(tuple(tokens), tuple(parents))
                tokens.append(candidate[level])
                parents.append(at[i])
                edges[edge] = len(tokens)
            at[i] = edges[edge]
    return TokenTree(tuple(tokens), tuple(parents)) if tokens else None
