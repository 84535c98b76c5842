"""Workloads in llama-bench terms: `pp N` (prefill N tokens), `tg N` (decode N tokens), at context depth `d`.

Every engine gets the same tokens: one stream drawn uniformly over the whole vocabulary from a fixed
seed (stdlib `random`, stable across platforms and Python versions). Nothing is excluded: EOS is a
token like any other, since no token loop under test stops on it.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from kerneltriage.core.errors import InputError

WORKLOAD_SEED = 1234
KINDS = ("pp", "tg")


@dataclass(frozen=True)
class Test:
    """One llama-bench test: `kind` pp or tg, `n` tokens, after `depth` tokens already in the cache."""

    __test__ = False  # not a pytest test class, whatever its name

    kind: str
    n: int
    depth: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"test kind {self.kind!r}: expected one of {KINDS}")
        if self.n < 1 or self.depth < 0:
            raise ValueError(f"test {self.kind}{self.n}: expected n ≥ 1 and depth ≥ 0, got n={self.n}, d={self.depth}")

    @property
    def name(self) -> str:
        """llama-bench's label: 'pp512', 'tg128 @ d4096'."""
        return f"{self.kind}{self.n}" + (f" @ d{self.depth}" if self.depth else "")

    @property
    def phase(self) -> str:
        return "prefill" if self.kind == "pp" else "decode"

    @property
    def prefix_length(self) -> int:
        """Tokens put in the cache before the timed part. A decode test needs logits to start from,
        so at depth 0 it prefills one token (as a generation starts from at least one prompt token)."""
        return self.depth if self.kind == "pp" else max(self.depth, 1)

    @property
    def context_needed(self) -> int:
        """Cache positions the test fills: the prefix, then N prompt tokens or N decode steps."""
        return self.prefix_length + self.n


def expand(prompts: Sequence[int], generations: Sequence[int], depths: Sequence[int]) -> list[Test]:
    """The cross product like llama-bench: for each depth, a pp test per prompt size, then a tg test per
    generation size; 0 skips that test; duplicates dropped (order kept)."""
    for name, values in (("-p", prompts), ("-n", generations), ("-d", depths)):
        bad = [v for v in values if v < 0]
        if bad:
            raise InputError(f"{name} {bad[0]}: expected whole numbers ≥ 0")
    tests = []
    for depth in depths:
        tests += [Test("pp", p, depth) for p in prompts if p > 0]
        tests += [Test("tg", n, depth) for n in generations if n > 0]
    if not tests:
        raise InputError("-p/-n: every size is 0, so there is no test to run")
    return list(dict.fromkeys(tests))


def token_stream(vocab_size: int, length: int, seed: int = WORKLOAD_SEED) -> list[int]:
    """`length` token ids drawn uniformly from [0, vocab_size) with a fixed seed."""
    if vocab_size < 1 or length < 0:
        raise ValueError(f"token stream: vocab_size ≥ 1 and length ≥ 0, got {vocab_size}, {length}")
    rng = random.Random(seed)
    return [rng.randrange(vocab_size) for _ in range(length)]


@dataclass(frozen=True)
class Tokens:
    """The tokens of one test: `prefix` fills the cache untimed; `prompt` is the timed prefill (pp only)."""

    prefix: tuple[int, ...]
    prompt: tuple[int, ...]


def tokens_for(test: Test, vocab_size: int, seed: int = WORKLOAD_SEED) -> Tokens:
    """The test's tokens, cut from one stream: the prefix first, the timed prompt right after it."""
    stream = token_stream(vocab_size, test.prefix_length + (test.n if test.kind == "pp" else 0), seed)
    return Tokens(tuple(stream[: test.prefix_length]), tuple(stream[test.prefix_length:]))


@dataclass(frozen=True)
class PromptSet:
    """Real prompts for decode tests (`ab --prompts`): each tg sample decodes every prompt in turn."""

    name: str
    prompts: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        if not self.prompts or not all(self.prompts):
            raise ValueError(f"prompt set {self.name}: expected at least one non-empty prompt")

    @property
    def longest(self) -> int:
        return max(map(len, self.prompts))


def load_prompt_set(path: Path, tokenizer: Any, chat: bool = True) -> PromptSet:
    """A JSON-lines file of {"prompt": "..."} objects, each encoded (in the model's chat template by default)."""
    prompts = []
    try:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        texts = [json.loads(line)["prompt"] for line in lines]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"--prompts {path}: expected a JSON-lines file of {{\"prompt\": ...}} objects "
                         f"({exc})") from None
    for text in texts:
        if chat:
            text = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        prompts.append(tuple(tokenizer.encode(text, add_special=not chat)))
    if not prompts:
        raise InputError(f"--prompts {path}: expected at least one prompt")
    return PromptSet(path.stem, tuple(prompts))


def check_fits(tests: Iterable[Test], max_context: int) -> None:
    """InputError naming the first test that needs more positions than the model's context."""
    for test in tests:
        if test.context_needed > max_context:
            raise InputError(
                f"test {test.name}: needs {test.context_needed} positions, expected at most the model's "
                f"context of {max_context}"
            )


def depths_and_sizes(tests: Iterable[Test]) -> dict[str, list[int]]:
    """The distinct pp sizes, tg sizes and depths of `tests` (for a llama-bench command line)."""
    tests = list(tests)
    return {
        "pp": sorted({t.n for t in tests if t.kind == "pp"}),
        "tg": sorted({t.n for t in tests if t.kind == "tg"}),
        "depth": sorted({t.depth for t in tests}),
    }

