"""A constraint compiled for one tokenizer, and the matcher of one generation: which tokens may come next, as a
bitmask on the host (llguidance computes it: ~10-80 µs a token on the 2-core CPU, both vocabularies measured in
docs/constrained.md), advanced by each token the generation emits.

Compiling is once per (constraint, tokenizer): the tokenizer's llguidance form (~1.5 s for 49k tokens, ~13 s for
262k) and the grammar are cached; a generation's matcher costs ~1 ms.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np

from kerneltriage.core.errors import InputError

if TYPE_CHECKING:
    from kerneltriage.engine.constraint import Constraint
    from kerneltriage.engine.tokenizer import Tokenizer

WORD_BITS = 32  # llguidance's bitmask: int32 words, token t is bit t % 32 of word t // 32


def _llguidance(flag: str) -> Any:
    try:
        import llguidance
    except ImportError:
        raise InputError(f"{flag}: constrained decoding needs the llguidance package "
                         "(pip install llguidance)") from None
    return llguidance


def require_library(constraint: "Constraint") -> None:
    """An InputError naming the constraint's flag where llguidance is not installed (checked before loading)."""
    _llguidance(constraint.flag)


class Grammar:
    """`constraint` compiled for `tokenizer`, the logits `vocab` wide (a model's vocabulary may be padded past the
    tokenizer's): makes one `Matcher` per generation."""

    def __init__(self, constraint: "Constraint", tokenizer: "Tokenizer", vocab: int) -> None:
        self.constraint, self.vocab = constraint, vocab
        llg = _llguidance(constraint.flag)
        self.eos = _end_token(tokenizer, vocab, constraint.flag)
        self.tokenizer = llg.LLTokenizer(_wrapped(llg, tokenizer, self.eos) if tokenizer.is_synthetic
                                         else tokenizer.to_json(), n_vocab=vocab, eos_token=self.eos)
        self.text = constraint.grammar()
        error = llg.LLMatcher.validate_grammar(self.text, self.tokenizer)
        if error:
            raise InputError(f"{constraint.label}: {error.splitlines()[0]}")

    def matcher(self) -> "Matcher":
        return Matcher(self)


class Matcher:
    """One generation's position in the grammar. `follow` commits a token; `mask` is the next token's bitmask
    (int32 words); `ahead(tokens)` looks at the mask after tokens not committed (a speculative draft), leaving the
    state as it was. Once the grammar is complete and EOS followed, only EOS is allowed (a benchmark's fixed-length
    decode keeps emitting it)."""

    def __init__(self, grammar: Grammar) -> None:
        llg = _llguidance(grammar.constraint.flag)
        self.grammar, self.eos = grammar, grammar.eos
        self.matcher = llg.LLMatcher(grammar.tokenizer, grammar.text, log_level=0)
        self.words = np.zeros(-(-grammar.vocab // WORD_BITS), dtype=np.int32)
        self.only_eos = np.zeros_like(self.words)
        self.only_eos[self.eos // WORD_BITS] = np.int32(np.uint32(1 << (self.eos % WORD_BITS)).view(np.int32))
        self.followed = 0  # tokens committed
        self.done = False  # EOS followed: the output is complete

    def follow(self, token: int) -> None:
        """Commit `token` (one the mask allowed)."""
        self.followed += 1
        if self.done:
            return
        if token == self.eos and self.matcher.is_accepting():
            self.done = True
            return
        if not self.matcher.consume_token(token):
            raise RuntimeError(f"{self.grammar.constraint.label}: token {token} outside the constraint was emitted "
                               f"({self.matcher.get_error()})")

    def mask(self) -> np.ndarray:
        """The next token's bitmask (int32 words; a view refilled by the next call)."""
        if self.done or self.matcher.is_stopped():
            return self.only_eos
        self.matcher.unsafe_compute_mask_ptr(self.words.ctypes.data, self.words.nbytes)
        return self.words

    @contextmanager
    def ahead(self, tokens: Sequence[int]) -> Iterator[None]:
        """Inside: the state after `tokens` as well (the longest prefix the grammar takes: past a token it refuses,
        acceptance stops anyway); after: the state before."""
        taken = 0 if self.done else self.matcher.validate_tokens(list(tokens))
        if taken:
            self.matcher.consume_tokens(list(tokens[:taken]))
        try:
            yield
        finally:
            if taken:
                self.matcher.rollback(taken)


def allowed_ids(words: np.ndarray, vocab: int) -> np.ndarray:
    """The token ids a bitmask allows, ascending (int64)."""
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab]
    return np.flatnonzero(bits)


def _end_token(tokenizer: "Tokenizer", vocab: int, flag: str) -> int:
    """The token that ends a constrained output: the model's first EOS; a synthetic (preset) tokenizer has none, so
    the last id stands for it there."""
    if tokenizer.eos_token_ids:
        return tokenizer.eos_token_ids[0]
    if tokenizer.is_synthetic:
        return vocab - 1
    raise InputError(f"{flag}: {tokenizer.source} has no end token, so a constrained output could never end")


def _wrapped(llg: Any, tokenizer: "Tokenizer", eos: int) -> Any:
    """A byte tokenizer (presets) in llguidance's form: ids below 256 are bytes, others have no text."""
    byte_vocab = 256

    class Bytes:
        eos_token_id, bos_token_id = eos, None
        tokens = [bytes([i]) if i < byte_vocab else b"" for i in range(tokenizer.vocab_size)]
        special_token_ids = [eos]

        def __call__(self, text: bytes) -> list[int]:
            return list(text)

    return llg.TokenizerWrapper(Bytes())
