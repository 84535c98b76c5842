"""What `--spec` and `--spec-depth` ask for: the speculation's source (prompt lookup, longest-match lookup, the
target's own first layers, a draft model, or an EAGLE-style head on the target's hidden states) and its depth,
parsed once; and the draft model's vocabulary check."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kerneltriage.core.errors import InputError
from kerneltriage.engine.speculative.tree import DEFAULT_TREE_NODES

if TYPE_CHECKING:
    from kerneltriage.engine.checkpoint import Checkpoint

SOURCES = ("ngram", "suffix", "selfdraft", "draft", "eagle")
MAX_DEPTH = 31  # deepest --spec-depth and suffix:N accepted: a verify of 32 rows, fused_layer's MAX_ROWS
AUTO_START_DEPTH = 4  # where --spec-depth auto begins
AUTO_MAX_DEPTH = 8  # auto grows k no further (an eager verify: its cost grows with the rows)
# Where verifies are captured at fixed shapes (graphs), the rows a verify is padded to: the smallest of these that
# holds its k + 1. A graphed verify of the default model's shapes at 2 / 4 / 8 / 16 / 24 / 32 rows cost 661 / 976 /
# 1,564 / 729 / 828 / 845 µs against a plain step's 545–585 (H200, verify-rows-smollm2-preset-h200.json: from 16 rows
# the GEMVs run tl.dot, below it the CUDA cores' sums): 16 rows cost what 9 do, and 32 cost 16% more than 16. So a
# lookup drafter drafts up to 15 tokens for the price of one padded shape, and to 31 where a long match says a copy
# is in progress (suffix.py). The row-limited paths (the quantized GEMV, flex_decode, the kernel seams: ≤ 16 rows)
# take a 32-row verify through the stock ops; the controller measures each shape's cost. A model drafter keeps
# AUTO_MAX_DEPTH: each of its tokens is a forward of its own.
VERIFY_BUCKETS = (16, 32)
PADDED_MAX_DEPTH = VERIFY_BUCKETS[-1] - 1
DEFAULT_NGRAM = 3  # ngram: longest context suffix matched
RESIDENT_LOOKBACK = 32  # suffix drafted on the device (resident steps): the longest match it measures, in tokens
DEFAULT_SUFFIX = MAX_DEPTH  # suffix: most tokens one step drafts (the match's statistics pick fewer)
SPEC_HELP = "ngram[:N] | suffix[:N] | suffix:tree | selfdraft[:L] | draft:MODEL | eagle[:PATH]"
TREE_ARG = "tree"  # suffix:tree: the suffix drafter's branches verified as a token tree (greedy only)
TREE_GREEDY_ONLY = ("a token tree is verified at temperature 0 only (exact tree sampling needs recursive "
                    "rejection sampling, not built); use suffix[:N] at temperature > 0")
TREE_EAGER_ONLY = ("a token tree is verified eagerly only (compile, graphs and flex_decode verify fixed-shape "
                   "causal blocks, not a tree mask); use suffix[:N] with those levers")
LOOKUP_SOURCES = ("ngram", "suffix")  # drafting from the text alone: no forward, so it can be scored for free
VOCAB_PROBE = "The quick brown fox → 42 façades, 東京 and `def f(x): return x**2` {\"a\": [1, 2]}"


def padded_rows(k: int, deepest: int) -> int:
    """The rows a padded verify of k drafts computes: the smallest of VERIFY_BUCKETS that holds k + 1, or deepest + 1
    where that is smaller (a fixed depth, or a drafter whose limit is shallower)."""
    return min(next((rows for rows in VERIFY_BUCKETS if rows > k), k + 1), deepest + 1)


@dataclass(frozen=True)
class Speculation:
    """What `--spec` and `--spec-depth` asked for; `depth` None means auto (adaptive)."""

    source: str
    layers: int | None = None  # selfdraft: the target's first L layers draft (None: half of them)
    draft_model: str | None = None  # draft: the --model spec of the draft model
    head: str | None = None  # eagle: the head's file (None: the one `distill --eagle` wrote for the target)
    depth: int | None = None
    ngram_max: int = DEFAULT_NGRAM
    suffix_max: int = DEFAULT_SUFFIX  # suffix: most tokens one step drafts
    tree_nodes: int = 0  # suffix: > 0 drafts a token tree of at most this many nodes (0: one sequence)

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"spec source {self.source!r}: expected one of {', '.join(SOURCES)}")
        if self.layers is not None and (self.source != "selfdraft" or self.layers < 1):
            raise ValueError(f"layers={self.layers}: expected a positive count, for selfdraft only")
        if (self.source == "draft") != bool(self.draft_model):
            raise ValueError(f"draft_model={self.draft_model!r}: expected a model for source 'draft' only")
        if self.head is not None and self.source != "eagle":
            raise ValueError(f"head={self.head!r}: expected a head file for source 'eagle' only")
        if self.depth is not None and not 1 <= self.depth <= MAX_DEPTH:
            raise ValueError(f"depth={self.depth}: expected 1..{MAX_DEPTH} or None (auto)")
        if self.ngram_max < 1:
            raise ValueError(f"ngram_max={self.ngram_max}: expected >= 1")
        if not 1 <= self.suffix_max <= MAX_DEPTH:
            raise ValueError(f"suffix_max={self.suffix_max}: expected 1..{MAX_DEPTH}")
        if self.tree_nodes and (self.source != "suffix" or not 1 <= self.tree_nodes <= MAX_DEPTH):
            raise ValueError(f"tree_nodes={self.tree_nodes}: expected 1..{MAX_DEPTH}, for suffix only")

    @property
    def source_text(self) -> str:
        """`--spec` as written, parameters explicit where they have a default: `ngram:3`, `selfdraft`."""
        arg = {"ngram": str(self.ngram_max), "suffix": self._suffix_arg,
               "selfdraft": self.layers and str(self.layers), "draft": self.draft_model, "eagle": self.head}
        return self.source + (f":{arg[self.source]}" if arg[self.source] else "")

    @property
    def tree(self) -> bool:
        """Drafts a token tree (several branches per verify) rather than one sequence."""
        return self.tree_nodes > 0

    @property
    def _suffix_arg(self) -> str:
        return TREE_ARG if self.tree else str(self.suffix_max)

    @property
    def lookback(self) -> int:
        """The longest suffix a draft made on the device matches (resident steps): ngram's n, else
        RESIDENT_LOOKBACK (beyond it only which earlier occurrence is copied can differ from the host's suffix)."""
        return self.ngram_max if self.source == "ngram" else RESIDENT_LOOKBACK

    @property
    def lookup(self) -> bool:
        """Drafts from the text alone (no forward)."""
        return self.source in LOOKUP_SOURCES

    @property
    def label(self) -> str:
        """`--spec` as the user would write it, with the depth."""
        arg = {"ngram": str(self.ngram_max), "suffix": self._suffix_arg,
               "selfdraft": str(self.layers or "half"), "draft": self.draft_model,
               "eagle": self.head or "cached"}
        return f"{self.source}:{arg[self.source]} k={self.depth or 'auto'}"


def parse_speculation(spec: str | None, depth: str | None = None) -> Speculation | None:
    """`--spec` and `--spec-depth` → a Speculation (None when --spec is absent); bad values are InputErrors."""
    if not spec:
        if depth not in (None, "auto"):
            raise InputError(f"--spec-depth {depth}: needs --spec ({SPEC_HELP})")
        return None
    source, colon, arg = spec.partition(":")
    bad = InputError(f"--spec {spec!r}: expected {SPEC_HELP}")
    if source == "draft":
        if not arg:
            raise bad
        return Speculation("draft", draft_model=arg, depth=_parse_depth(depth))
    if source == "eagle":
        if colon and not arg:
            raise bad
        return Speculation("eagle", head=arg or None, depth=_parse_depth(depth))
    if source == "suffix" and arg == TREE_ARG:
        return Speculation("suffix", depth=_parse_depth(depth), tree_nodes=DEFAULT_TREE_NODES)
    if source not in ("ngram", "suffix", "selfdraft") or (colon and not (arg.isdigit() and int(arg) > 0)):
        raise bad
    count = int(arg) if arg else None
    if source == "ngram":
        return Speculation("ngram", depth=_parse_depth(depth), ngram_max=count or DEFAULT_NGRAM)
    if source == "suffix":
        if count is not None and count > MAX_DEPTH:
            raise InputError(f"--spec {spec!r}: suffix:N takes N in 1..{MAX_DEPTH}")
        return Speculation("suffix", depth=_parse_depth(depth), suffix_max=count or DEFAULT_SUFFIX)
    return Speculation("selfdraft", layers=count, depth=_parse_depth(depth))


def _parse_depth(depth: str | None) -> int | None:
    if depth in (None, "auto"):
        return None
    if not (depth.isdigit() and 1 <= int(depth) <= MAX_DEPTH):
        raise InputError(f"--spec-depth {depth!r}: expected a whole number 1..{MAX_DEPTH} or auto")
    return int(depth)


def check_same_vocabulary(target: "Checkpoint", draft: "Checkpoint") -> None:
    """A draft model must score the target's token ids: same logit width and the same tokenizer."""
    sizes = (target.config.vocab_size, draft.config.vocab_size)
    same = sizes[0] == sizes[1] and target.tokenizer.vocab_size == draft.tokenizer.vocab_size
    if not same or target.tokenizer.encode(VOCAB_PROBE) != draft.tokenizer.encode(VOCAB_PROBE):
        raise InputError(
            f"--spec draft:{draft.source}: its vocabulary ({sizes[1]} logits, {draft.tokenizer.vocab_size} tokens) "
            f"differs from the target's ({sizes[0]} logits, {target.tokenizer.vocab_size} tokens); "
            "a draft model must share the target's tokenizer")

