"""Tokenizer: GGUF files (byte-level BPE and sentencepiece), HF folders, bytes, chat templates."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import tokenizers
from gguf import GGUFWriter
from tokenizers import models, pre_tokenizers

from kerneltriage.core.errors import InputError
from kerneltriage.engine.tokenizer import ByteTokenizer, Tokenizer

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Byte-level spellings: "Ġ" is a space, "Ċ" a newline.
BPE_MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d", "Ġ Ġ"]
TEXTS = ["hello world", "hello\n\n  world!", "naïve café 日本 😀👍🏽", "<|im_start|>user\nhi<|im_end|>", ""]


def gpt2_meta() -> dict:
    """A GGUF-style byte-level BPE vocabulary: specials, the 256 byte symbols, and a few merges."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    merged = [m.replace(" ", "") for m in BPE_MERGES]
    tokens = SPECIALS + alphabet + merged
    return {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)),
        "tokenizer.ggml.merges": BPE_MERGES,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": CHATML,
    }


def llama_meta() -> dict:
    """A GGUF-style sentencepiece vocabulary: <unk>/<s>/</s>, 256 byte-fallback tokens, scored pieces."""
    pieces = ["▁", "h", "e", "l", "o", "w", "r", "d", "ll"]
    pieces += ["▁h", "▁he", "▁hell", "▁hello", "▁w", "▁wo", "▁wor", "▁worl", "▁world"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    return {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [0.0] * 259 + [-float(i) for i in range(len(pieces))],
        "tokenizer.ggml.token_type": [2, 3, 3] + [6] * 256 + [1] * len(pieces),
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    }


def write_gguf(path: Path, meta: dict) -> Path:
    """`meta` as a GGUF file without tensors (the tokenizer reads none), through gguf's typed adders."""
    w = GGUFWriter(path, meta["general.architecture"])
    adders = {
        "tokenizer.ggml.model": w.add_tokenizer_model, "tokenizer.ggml.pre": w.add_tokenizer_pre,
        "tokenizer.ggml.tokens": w.add_token_list, "tokenizer.ggml.token_type": w.add_token_types,
        "tokenizer.ggml.merges": w.add_token_merges, "tokenizer.ggml.scores": w.add_token_scores,
        "tokenizer.ggml.bos_token_id": w.add_bos_token_id, "tokenizer.ggml.eos_token_id": w.add_eos_token_id,
        "tokenizer.ggml.unknown_token_id": w.add_unk_token_id, "tokenizer.ggml.add_bos_token": w.add_add_bos_token,
        "tokenizer.chat_template": w.add_chat_template,
    }
    for key, value in meta.items():
        if key != "general.architecture":  # GGUFWriter wrote it
            adders[key](value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def gpt2_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny-gpt2.gguf", gpt2_meta())


@pytest.fixture(scope="module")
def gpt2(gpt2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return Tokenizer.from_gguf(gpt2_gguf, gpt2_meta(), cache=tmp_path_factory.mktemp("gpt2"))


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    path = write_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf", llama_meta())
    return Tokenizer.from_gguf(path, llama_meta())


def stream(tok: Tokenizer, ids: list[int]) -> list[str]:
    step = tok.stream_decoder()
    return [step(i) for i in ids]


@pytest.mark.parametrize("text", TEXTS)
def test_gpt2_roundtrip_and_stream(gpt2: Tokenizer, text: str) -> None:
    ids = gpt2.encode(text)
    assert gpt2.decode(ids) == text
    assert "".join(stream(gpt2, ids)) == text


def test_gpt2_merges_specials_and_attributes(gpt2: Tokenizer) -> None:
    tokens = gpt2_meta()["tokenizer.ggml.tokens"]
    hello = tokens.index("hello")  # one merged token
    assert (gpt2.vocab_size, gpt2.bos_token_id, gpt2.eos_token_ids, gpt2.add_bos) == (len(tokens), 1, (2,), False)
    assert not gpt2.is_synthetic
    assert gpt2.encode("hello") == [hello]
    assert gpt2.encode("<|im_start|>hello<|im_end|>") == [1, hello, 2]  # specials stay whole
    assert gpt2.decode([1, hello, 2], skip_special=True) == "hello"


def test_stream_holds_back_a_split_emoji(gpt2: Tokenizer) -> None:
    ids = gpt2.encode("a😀")
    assert len(ids) == 5  # "a" + four byte tokens of U+1F600
    assert stream(gpt2, ids) == ["a", "", "", "", "😀"]


def test_gguf_tokenizer_is_cached_and_reloaded(
    gpt2_gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, cache = tmp_path / "tiny.gguf", tmp_path / "cache"
    shutil.copy(gpt2_gguf, path)
    first = Tokenizer.from_gguf(path, gpt2_meta(), cache=cache)
    assert (cache / "tokenizer.json").is_file()
    assert not list(cache.glob("*.tmp"))
    assert capsys.readouterr().out == ""  # stdout carries generated text only
    path.unlink()  # proves the second build reads the cache, not the file...
    meta = gpt2_meta()
    del meta["tokenizer.ggml.merges"]  # ...nor the metadata
    second = Tokenizer.from_gguf(path, meta, cache=cache)
    assert [second.encode(t) for t in TEXTS] == [first.encode(t) for t in TEXTS]


@pytest.mark.parametrize("text", ["hello world", "hello  world", "héllo 😀\nworld"])
def test_sentencepiece_roundtrip_with_bos(llama: Tokenizer, text: str) -> None:
    ids = llama.encode(text)
    assert llama.add_bos and ids[0] == 1
    assert llama.encode(text, add_special=False) == ids[1:]
    assert llama.decode(ids, skip_special=True) == text
    assert "".join(stream(llama, ids[1:])) == llama.decode(ids[1:]) == text


def test_sentencepiece_uses_pieces_and_byte_fallback(llama: Tokenizer) -> None:
    tokens = llama_meta()["tokenizer.ggml.tokens"]
    assert [tokens[i] for i in llama.encode("hello world", add_special=False)] == ["▁hello", "▁world"]
    assert [tokens[i] for i in llama.encode("é", add_special=False)] == ["▁", "<0xC3>", "<0xA9>"]


@pytest.mark.parametrize("missing", ["tokenizer.ggml.tokens", "tokenizer.ggml.model"])
def test_missing_tokenizer_fields_are_input_errors(missing: str, tmp_path: Path) -> None:
    meta = gpt2_meta()
    del meta[missing]
    path = write_gguf(tmp_path / "m.gguf", meta)
    with pytest.raises(InputError, match=f"GGUF {re.escape(str(path))}: no tokenizer \\({missing} missing\\)"):
        Tokenizer.from_gguf(path, meta)


def test_unsupported_tokenizer_model_is_input_error(tmp_path: Path) -> None:
    meta = {**gpt2_meta(), "tokenizer.ggml.model": "bert"}
    path = write_gguf(tmp_path / "m.gguf", meta)
    with pytest.raises(InputError, match=f"GGUF {re.escape(str(path))}: tokenizer model 'bert' is not supported"):
        Tokenizer.from_gguf(path, meta)


def test_vocabulary_transformers_cannot_convert_is_input_error(tmp_path: Path) -> None:
    meta = {**gpt2_meta(), "tokenizer.ggml.merges": ["zz qq", *BPE_MERGES]}  # merges tokens not in the vocab
    path = write_gguf(tmp_path / "m.gguf", meta)
    # Caught before the conversion (which takes seconds on a real vocabulary), naming the merge.
    with pytest.raises(InputError, match=f"GGUF {re.escape(str(path))}: tokenizer.ggml.merges.0. = 'zz qq'") as info:
        Tokenizer.from_gguf(path, meta)
    assert "\n" not in str(info.value)


def test_chat_template_renders_chatml(gpt2: Tokenizer) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    expected = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert gpt2.apply_chat_template(messages) == expected
    assert gpt2.apply_chat_template(messages, add_generation_prompt=False) == expected.removesuffix(
        "<|im_start|>assistant\n"
    )


def test_chat_template_helpers_and_errors(gpt2_gguf: Path) -> None:
    def with_template(template: str) -> Tokenizer:
        return Tokenizer.from_gguf(gpt2_gguf, {**gpt2_meta(), "tokenizer.chat_template": template})

    tok = with_template("{{ bos_token }}{{ messages | tojson }}{{ eos_token }}")
    assert tok.apply_chat_template([{"role": "user", "content": "é<"}]) == (
        '<|im_start|>[{"role": "user", "content": "é<"}]<|im_end|>'
    )
    source = re.escape(str(gpt2_gguf))
    with pytest.raises(InputError, match=f"chat template of {source}: roles must alternate"):
        with_template("{{ raise_exception('roles must alternate') }}").apply_chat_template([])
    with pytest.raises(InputError, match=f"chat template of {source}: Unexpected end of template"):
        with_template("{% if x %}").apply_chat_template([])


def test_no_chat_template_is_input_error(llama: Tokenizer) -> None:
    with pytest.raises(InputError, match="--chat needs a model with a chat template; .*/tiny-llama.gguf has none"):
        llama.apply_chat_template([{"role": "user", "content": "hi"}])


def write_hf_dir(folder: Path, config: dict) -> Path:
    vocab = {"<s>": 0, "</s>": 1, "a": 2, "b": 3, "ab": 4}
    backend = tokenizers.Tokenizer(models.BPE(vocab, [("a", "b")]))
    backend.add_special_tokens(["<s>", "</s>"])
    backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_from_hf_dir_reads_config(tmp_path: Path) -> None:
    config = {"bos_token": {"content": "<s>"}, "eos_token": "</s>", "add_bos_token": True, "chat_template": "T"}
    tok = Tokenizer.from_hf_dir(write_hf_dir(tmp_path, config))
    assert (tok.bos_token_id, tok.eos_token_ids, tok.add_bos, tok.chat_template) == (0, (1,), True, "T")
    assert tok.encode("abab") == [0, 4, 4]
    assert tok.encode("abab", add_special=False) == [4, 4]


def test_from_hf_dir_prefers_jinja_file_and_generation_eos(tmp_path: Path) -> None:
    write_hf_dir(tmp_path, {"eos_token": "</s>", "chat_template": "old"})
    (tmp_path / "chat_template.jinja").write_text("new")
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 3]}))
    tok = Tokenizer.from_hf_dir(tmp_path)
    assert (tok.chat_template, tok.eos_token_ids, tok.add_bos) == ("new", (1, 3), False)


def test_from_hf_dir_without_tokenizer_json_is_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no tokenizer.json"):
        Tokenizer.from_hf_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"model": ')
    with pytest.raises(InputError, match="tokenizer.json: not a valid tokenizer.json"):
        Tokenizer.from_hf_dir(tmp_path)


@pytest.mark.parametrize("text", ["plain ascii", "naïve 日本 😀", ""])
def test_byte_tokenizer_roundtrip(text: str) -> None:
    tok = Tokenizer.synthetic(300)
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text == "".join(stream(tok, ids))
    assert tok.is_synthetic and tok.chat_template is None and tok.vocab_size == 300


def test_byte_tokenizer_marks_non_byte_ids() -> None:
    tok = ByteTokenizer(300)
    emoji = list("😀".encode())
    assert tok.decode([104, 299, *emoji, 256]) == "h⟨299⟩😀⟨256⟩"
    assert stream(tok, [*emoji[:2], 257]) == ["", "", "\ufffd⟨257⟩"]  # a cut character is shown, not lost
    with pytest.raises(InputError, match="--chat needs"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


def hf_tokenizer(gguf: Path):  # noqa: ANN201 - a transformers tokenizer
    """transformers' own conversion of the GGUF's tokenizer."""
    import transformers

    return transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


@pytest.mark.real_model
def test_default_gguf_matches_transformers(default_gguf: Path, tmp_path: Path, hf_gguf) -> None:  # noqa: ANN001
    from kerneltriage.engine.gguf_file import read_gguf

    meta = read_gguf(default_gguf).meta
    with hf_gguf():
        ours = Tokenizer.from_gguf(default_gguf, meta, cache=tmp_path)
        cached = Tokenizer.from_gguf(default_gguf, meta, cache=tmp_path)
        reference = hf_tokenizer(default_gguf)
    texts = [*TEXTS, "  leading\ttabs\r\n", "def f(x):\n    return x**2  # ok\n", "3.14+1234567", "한국어 🇫🇷"]
    for text in texts:
        ids = reference.encode(text)
        assert ours.encode(text) == cached.encode(text) == ids
        assert ours.decode(ids) == "".join(stream(ours, ids)) == reference.decode(ids)
    messages = [{"role": "user", "content": "Hi there"}]
    assert ours.apply_chat_template(messages) == reference.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert (ours.vocab_size, ours.bos_token_id, ours.eos_token_ids, ours.add_bos) == (49152, 1, (2,), False)
