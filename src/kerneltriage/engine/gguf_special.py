"""What a GGUF vocabulary's special tokens and flags are when a key is missing: llama.cpp's answer
(src/llama-vocab.cpp, `llama_vocab::impl::load`), taken only where it is more than a guess, and said in one line;
else an error naming the key.

- `tokenizer.ggml.pre` missing (byte-level BPE): llama.cpp warns that generation quality will suffer and splits text
  with its default pattern; transformers' conversion splits it as GPT-2 does. Said.
- `tokenizer.ggml.add_bos_token` missing: llama.cpp adds BOS to a sentencepiece vocabulary and to a BPE one whose
  pre-tokenizer is in `BOS_BY_DEFAULT_PRE`, to no other. Said.
- `tokenizer.ggml.eos_token_id` (and eot/eom) missing: llama.cpp ends generation at the tokens it finds by their text
  (`END_TEXTS`, its end-of-generation list) and at sentencepiece's `</s>` (its default id 2). Said; where none is in
  the vocabulary generation would never stop: an error.
- `tokenizer.ggml.bos_token_id` missing where BOS is added: llama.cpp falls back to a fixed id (1 for sentencepiece,
  11 for BPE: GPT-2's ','), a guess. An error.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from kerneltriage.core.errors import InputError
from kerneltriage.engine.metadata import SettingsReader

SENTENCEPIECE = "llama"  # tokenizer.ggml.model of a sentencepiece vocabulary ("gpt2": byte-level BPE)
BOS_BY_DEFAULT_PRE = ("llama3", "llama-v3", "llama-bpe", "falcon3", "tekken", "chameleon")
END_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>")
SENTENCEPIECE_END = "</s>"
END_KEYS = ("eos_token_id", "eot_token_id", "eom_token_id")


@dataclass(frozen=True)
class SpecialTokens:
    """BOS/EOS ids and whether each is added to a prompt; `notes`: each fallback taken, one line apiece."""

    bos: int | None
    eos: tuple[int, ...]
    add_bos: bool
    add_eos: bool
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.add_bos and self.bos is None:
            raise ValueError("add_bos without a BOS id")
        if not self.eos:
            raise ValueError("no end-of-sequence id")


def special_tokens(path: Path, meta: Mapping[str, Any]) -> SpecialTokens:
    """The special tokens of the GGUF `path` (metadata `meta`, its token ids already checked against the vocabulary:
    gguf_vocab.check_special_ids), with llama.cpp's fallbacks for missing keys."""
    read = SettingsReader(meta, f"GGUF {path}", prefix="tokenizer.ggml.")
    kind, notes = meta["tokenizer.ggml.model"], []
    if kind != SENTENCEPIECE and "tokenizer.ggml.pre" not in meta:
        notes.append(f"{path}: no tokenizer.ggml.pre: its text is split as GPT-2 splits it (llama.cpp warns likewise "
                     "and uses its default), which may not be how the model's own tokenizer split it")
    add_bos = _add_bos(read, kind, meta.get("tokenizer.ggml.pre"), notes, path)
    bos = read.token("bos_token_id")
    if add_bos and bos is None:
        raise InputError(f"GGUF {path}: no tokenizer.ggml.bos_token_id, yet BOS is added to every prompt; expected "
                         "the id of its BOS token")
    eos = tuple(dict.fromkeys(i for key in END_KEYS if (i := read.token(key)) is not None))
    if not eos:
        eos = _end_by_text(path, kind, meta["tokenizer.ggml.tokens"], notes)
    return SpecialTokens(bos, eos, add_bos, read.flag("add_eos_token"), tuple(notes))


def _add_bos(read: SettingsReader, kind: str, pre: Any, notes: list[str], path: Path) -> bool:
    if "tokenizer.ggml.add_bos_token" in read.data:
        return read.flag("add_bos_token")
    added = kind == SENTENCEPIECE or pre in BOS_BY_DEFAULT_PRE
    vocabulary = "a sentencepiece vocabulary" if kind == SENTENCEPIECE else f"a BPE vocabulary with pre {pre!r}"
    notes.append(f"{path}: no tokenizer.ggml.add_bos_token: BOS is {'' if added else 'not '}added to a prompt, "
                 f"llama.cpp's default for {vocabulary}")
    return added


def _end_by_text(path: Path, kind: str, tokens: list[str], notes: list[str]) -> tuple[int, ...]:
    """The end-of-generation tokens llama.cpp finds by their text; an error where there is none."""
    texts = END_TEXTS + ((SENTENCEPIECE_END,) if kind == SENTENCEPIECE else ())
    found = tuple(index for index, token in enumerate(tokens) if token in texts)
    if not found:
        raise InputError(f"GGUF {path}: no end-of-sequence token (tokenizer.ggml.eos_token_id missing and none of "
                         f"{', '.join(texts)} in the vocabulary): generation would never stop")
    named = ", ".join(f"{tokens[index]} ({index})" for index in found)
    notes.append(f"{path}: no tokenizer.ggml.eos_token_id: generation ends at {named}, found by their text as "
                 "llama.cpp finds end-of-generation tokens")
    return found
