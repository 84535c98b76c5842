"""Corrupt GGUFs that loaded without a word (a fuzz run of 3,000 mutated files found them): each now a one-line
error naming the file; a key a file really lacks takes llama.cpp's fallback, said once, or is an error where
llama.cpp would only guess."""

from __future__ import annotations

from pathlib import Path

import pytest

from gguf_mutate import rename_key, rename_tensor
from kerneltriage.core.errors import InputError
from kerneltriage.engine.gguf_header import read_header
from kerneltriage.engine.gguf_special import special_tokens
from kerneltriage.engine.sources import load_checkpoint
from test_tokenizer import gpt2_meta, llama_meta
from tiny_gguf import write_tiny_gguf


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNELTRIAGE_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


def refused(path: Path, *needles: str) -> None:
    with pytest.raises(InputError) as info:
        load_checkpoint(str(path))
    message = str(info.value)
    assert "\n" not in message and str(path) in message, message
    for needle in needles:
        assert needle in message, message


def test_a_renamed_tensor_is_refused_not_ignored(tiny: Path, tmp_path: Path) -> None:
    """`output.weight` → `octput.weight`: the head was dropped and the embeddings silently tied."""
    path = tmp_path / "renamed.gguf"
    path.write_bytes(rename_tensor(tiny.read_bytes(), read_header(tiny), "output.weight", "octput.weight"))
    refused(path, "tensor 'octput.weight' is no weight of a llama model")


@pytest.mark.parametrize(("key", "renamed"), [
    ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eos_tokem_id"),  # generation never stopped
    ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.bos_token_ad"),
    ("llama.vocab_size", "llama.vocab_sizg"),
    ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_bos_tokem"),
    ("tokenizer.ggml.pre", "tokenizer.ggml.prg"),
])
def test_a_renamed_key_is_refused_not_defaulted(tiny: Path, tmp_path: Path, key: str, renamed: str) -> None:
    path = tmp_path / "renamed.gguf"
    path.write_bytes(rename_key(tiny.read_bytes(), read_header(tiny), key, renamed))
    refused(path, f"metadata key {renamed!r} is no GGUF key but one character from {key!r}")


def test_a_missing_eos_ends_generation_where_llama_cpp_does_and_says_so(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = write_tiny_gguf(tmp_path / "no-eos.gguf", omit=("tokenizer.ggml.eos_token_id",))
    checkpoint = load_checkpoint(str(path))
    assert checkpoint.tokenizer.eos_token_ids == (0, 2)  # <|endoftext|> and <|im_end|>, found by their text
    err = capsys.readouterr().err
    assert err.count(f"{path}: no tokenizer.ggml.eos_token_id: generation ends at <|endoftext|> (0), "
                     "<|im_end|> (2)") == 1


def test_no_end_token_at_all_is_an_error() -> None:
    meta = gpt2_meta()
    del meta["tokenizer.ggml.eos_token_id"]
    meta["tokenizer.ggml.tokens"] = ["<pad>", *meta["tokenizer.ggml.tokens"][1:]]
    meta["tokenizer.ggml.tokens"][2] = "<sep>"
    with pytest.raises(InputError, match="x.gguf: no end-of-sequence token .*generation would never stop"):
        special_tokens(Path("x.gguf"), meta)


@pytest.mark.parametrize(("pre", "added"), [("smollm", False), ("llama-bpe", True), (None, False)])
def test_a_missing_add_bos_token_takes_llama_cpp_s_default_and_says_so(pre: str | None, added: bool) -> None:
    meta = gpt2_meta()
    del meta["tokenizer.ggml.add_bos_token"]
    if pre is None:
        del meta["tokenizer.ggml.pre"]
    else:
        meta["tokenizer.ggml.pre"] = pre
    special = special_tokens(Path("x.gguf"), meta)
    assert special.add_bos is added
    assert f"no tokenizer.ggml.add_bos_token: BOS is {'' if added else 'not '}added" in " ".join(special.notes)
    assert ("no tokenizer.ggml.pre: its text is split as GPT-2 splits it" in " ".join(special.notes)) is (pre is None)


def test_sentencepiece_defaults_add_bos_and_end_at_its_eos_text() -> None:
    meta = llama_meta()
    del meta["tokenizer.ggml.eos_token_id"]
    special = special_tokens(Path("x.gguf"), meta)
    assert (special.add_bos, special.bos, special.eos) == (True, 1, (2,))  # </s>, llama.cpp's id for it
    assert len(special.notes) == 2  # add_bos_token and eos_token_id; a sentencepiece vocabulary has no pre


def test_a_bos_added_but_not_named_is_an_error() -> None:
    meta = llama_meta()
    del meta["tokenizer.ggml.bos_token_id"]
    with pytest.raises(InputError, match="no tokenizer.ggml.bos_token_id, yet BOS is added to every prompt"):
        special_tokens(Path("x.gguf"), meta)


def test_a_complete_file_takes_no_fallback(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint = load_checkpoint(str(tiny))
    assert checkpoint.tokenizer.notes == () and capsys.readouterr().err == ""
