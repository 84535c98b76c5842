"""Text ↔ token ids: a thin wrapper over a `tokenizers.Tokenizer`, plus chat templates.

A GGUF carries its vocabulary as metadata; `AutoTokenizer.from_pretrained(folder, gguf_file=name)`
converts that into a `tokenizers.Tokenizer` (so our ids equal transformers'), and the result is
cached as `tokenizer.json` because importing transformers and converting cost seconds.
"""

from __future__ import annotations

import codecs
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import processors
from tokenizers.decoders import DecodeStream

from kerneltriage.core.errors import InputError
from kerneltriage.engine.chat_template import render_chat
from kerneltriage.engine.gguf_special import SpecialTokens, special_tokens
from kerneltriage.engine.gguf_vocab import check_special_ids, check_vocabulary

BYTE_VOCAB = 256  # ByteTokenizer: ids below this are raw UTF-8 bytes
# `tokenizer.ggml.model` values we convert: byte-level BPE and sentencepiece, what llama/qwen GGUFs use.
# Checked here because older transformers quietly build a wrong tokenizer for other values.
_GGUF_TOKENIZER_MODELS = ("gpt2", "llama")


class Tokenizer:
    """Encode/decode, stream-decode and chat-template rendering for one model."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer | None,
        *,
        source: str,
        vocab_size: int,
        bos_token_id: int | None,
        eos_token_ids: tuple[int, ...],
        add_bos: bool,
        chat_template: str | None,
        is_synthetic: bool = False,
        notes: tuple[str, ...] = (),
    ) -> None:
        self._backend = backend
        self.source = source
        self.vocab_size = vocab_size
        self.bos_token_id = bos_token_id
        self.eos_token_ids = eos_token_ids
        self.add_bos = add_bos
        self.chat_template = chat_template
        self.is_synthetic = is_synthetic
        self.notes = notes  # the fallbacks taken for what the model's files leave unsaid, one line each

    @property
    def _hf(self) -> tokenizers.Tokenizer:
        assert self._backend is not None, "only ByteTokenizer has no HF tokenizer, and it overrides every use"
        return self._backend

    @classmethod
    def from_backend(
        cls,
        backend: tokenizers.Tokenizer,
        source: str,
        bos_token_id: int | None,
        eos_token_ids: Sequence[int],
        chat_template: str | None,
    ) -> Tokenizer:
        """Wrap a built `tokenizers.Tokenizer`; whether BOS is added is read off its post-processor."""
        adds_bos = bos_token_id is not None and backend.encode("").ids[:1] == [bos_token_id]
        return cls(backend, source=source, vocab_size=backend.get_vocab_size(with_added_tokens=True),
                   bos_token_id=bos_token_id, eos_token_ids=tuple(dict.fromkeys(eos_token_ids)),
                   add_bos=adds_bos, chat_template=chat_template)

    @classmethod
    def from_gguf(cls, path: Path, meta: dict[str, Any], cache: Path | None = None) -> Tokenizer:
        """Build for the GGUF file `path` with metadata `meta`; `cache` (a per-model folder) keeps `tokenizer.json`."""
        for key in ("tokenizer.ggml.model", "tokenizer.ggml.tokens"):
            if key not in meta:
                raise InputError(f"GGUF {path}: no tokenizer ({key} missing)")
        kind = meta["tokenizer.ggml.model"]
        if kind not in _GGUF_TOKENIZER_MODELS:
            supported = ", ".join(_GGUF_TOKENIZER_MODELS)
            raise InputError(f"GGUF {path}: tokenizer model {kind!r} is not supported (expected one of {supported})")
        check_special_ids(path, meta)
        special = special_tokens(path, meta)
        cached = cache / "tokenizer.json" if cache is not None else None
        backend = _read_cached(cached)
        if backend is None:
            check_vocabulary(path, meta)  # before the conversion: its errors come after seconds, from deep inside
            backend = _convert_gguf_tokenizer(path, meta, special)
            if cached is not None:
                _cache_quietly(cached, backend.to_str())
        tokenizer = cls.from_backend(backend, str(path), special.bos, special.eos, meta.get("tokenizer.chat_template"))
        tokenizer.notes = special.notes
        return tokenizer

    @classmethod
    def from_hf_dir(cls, path: Path) -> Tokenizer:
        """Build from a Hugging Face folder: tokenizer.json (+ tokenizer_config.json, chat_template.jinja)."""
        path = Path(path)
        if not (path / "tokenizer.json").is_file():
            raise InputError(f"model folder {path}: no tokenizer.json (expected a Hugging Face tokenizer)")
        try:
            backend = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
        except Exception as exc:  # tokenizers raises a bare Exception for a file it cannot parse
            raise InputError(f"{path / 'tokenizer.json'}: not a valid tokenizer.json ({_reason(exc)})") from exc
        config = _read_json(path / "tokenizer_config.json")
        bos = _token_id(backend, config.get("bos_token"))
        eos = _token_id(backend, config.get("eos_token"))
        if "add_bos_token" in config or "add_eos_token" in config:
            backend.post_processor = _bos_eos_processor(backend, config, bos, eos)
        eos_ids = [eos] if eos is not None else []
        eos_ids += _as_list(_read_json(path / "generation_config.json").get("eos_token_id"))
        return cls.from_backend(backend, str(path), bos, eos_ids, _hf_chat_template(path, config))

    @staticmethod
    def synthetic(vocab_size: int) -> ByteTokenizer:
        """The tokenizer for random-weight presets (see `ByteTokenizer`)."""
        return ByteTokenizer(vocab_size)

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids of `text`; `add_special` adds BOS/EOS as the model's tokenizer does."""
        return self._hf.encode(text, add_special_tokens=add_special).ids

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """Text of `ids` (special tokens shown unless `skip_special`)."""
        return self._hf.decode(list(ids), skip_special_tokens=skip_special)

    def stream_decoder(self, skip_special: bool = False) -> Callable[[int], str]:
        """A function fed one id at a time that returns the text that became printable (maybe "")."""
        stream = DecodeStream(skip_special_tokens=skip_special)
        return lambda token_id: stream.step(self._hf, token_id) or ""

    def token_text(self, token_id: int | None) -> str:
        """The text of one token id ("" for None)."""
        return "" if token_id is None else self._hf.id_to_token(token_id) or ""

    def to_json(self) -> str:
        """The tokenizer as a Hugging Face tokenizer.json (a distilled draft model's folder carries it)."""
        return self._hf.to_str()

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """Render `messages` with the model's chat template, as transformers does."""
        if self.chat_template is None:
            raise InputError(f"--chat needs a model with a chat template; {self.source} has none")
        eos = self.eos_token_ids[0] if self.eos_token_ids else None
        return render_chat(self.chat_template, self.source, messages, add_generation_prompt=add_generation_prompt,
                           bos_token=self.token_text(self.bos_token_id), eos_token=self.token_text(eos))


class ByteTokenizer(Tokenizer):
    """For random-weight presets: ids 0..255 are UTF-8 bytes, any other id decodes to `⟨id⟩`."""

    def __init__(self, vocab_size: int) -> None:
        if vocab_size < BYTE_VOCAB:
            raise ValueError(f"vocab_size {vocab_size} < {BYTE_VOCAB}: a byte tokenizer needs every byte")
        super().__init__(None, source="synthetic byte tokenizer", vocab_size=vocab_size, bos_token_id=None,
                         eos_token_ids=(), add_bos=False, chat_template=None, is_synthetic=True)

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        """The UTF-8 bytes of `text`."""
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """Bytes decoded as UTF-8 (bad sequences become U+FFFD), other ids as `⟨id⟩`."""
        step = self.stream_decoder()
        return "".join(step(token_id) for token_id in ids) + step.flush()

    def stream_decoder(self, skip_special: bool = False) -> _ByteStream:
        """Incremental version of `decode`: a multi-byte character prints once its last byte arrives."""
        return _ByteStream()


class _ByteStream:
    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, token_id: int) -> str:
        if token_id < BYTE_VOCAB:
            return self._utf8.decode(bytes([token_id]))
        return self.flush() + f"⟨{token_id}⟩"

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


def _convert_gguf_tokenizer(path: Path, meta: dict[str, Any], special: SpecialTokens) -> tokenizers.Tokenizer:
    """transformers' conversion of the GGUF's vocabulary, with the BOS/EOS post-processor llama.cpp implies.

    The flags are `special`'s (the file's add_bos/eos_token, else llama.cpp's defaults: gguf_special), set here
    because older transformers ignore them and would drop Llama-2's BOS.
    """
    if "tokenizer.ggml.merges" not in meta and "tokenizer.ggml.scores" not in meta:
        raise InputError(f"GGUF {path}: no tokenizer (tokenizer.ggml.merges and tokenizer.ggml.scores missing)")
    from transformers import AutoTokenizer

    try:
        backend = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name).backend_tokenizer
    except Exception as exc:  # transformers and tokenizers raise ValueError, OSError, bare Exception...
        raise InputError(f"GGUF {path}: transformers could not convert its tokenizer ({_reason(exc)})") from exc
    flags = {"add_bos_token": special.add_bos, "add_eos_token": special.add_eos}
    backend.post_processor = _bos_eos_processor(backend, flags, special.bos, special.eos[0])
    return backend


def _read_cached(cached: Path | None) -> tokenizers.Tokenizer | None:
    """The converted tokenizer from the cache; None when absent or unreadable (a truncated or corrupt file is
    converted again and overwritten, not an error on every run until deleted by hand)."""
    if cached is None or not cached.is_file():
        return None
    try:
        return tokenizers.Tokenizer.from_file(str(cached))
    except Exception:  # tokenizers raises a bare Exception for a file it cannot parse
        return None


def _cache_quietly(cached: Path, text: str) -> None:
    """The cache only saves time: an unwritable cache folder means converting again next run, nothing worse."""
    try:
        _write_atomic(cached, text)
    except OSError:
        return


def _reason(exc: Exception) -> str:
    """The first line of an exception's message, for a one-line error."""
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _bos_eos_processor(
    backend: tokenizers.Tokenizer, config: dict, bos: int | None, eos: int | None
) -> processors.TemplateProcessing:
    """The post-processor transformers builds when tokenizer_config.json sets add_bos/eos_token."""
    bos_id = bos if config.get("add_bos_token") else None  # the ids it adds, where it adds them
    eos_id = eos if config.get("add_eos_token") else None
    add_bos, add_eos = bos_id is not None, eos_id is not None
    bos_text = "" if bos_id is None else backend.id_to_token(bos_id) or ""
    eos_text = "" if eos_id is None else backend.id_to_token(eos_id) or ""
    single = f"{bos_text + ':0 ' if add_bos else ''}$A:0{' ' + eos_text + ':0' if add_eos else ''}"
    pair = f"{single}{' ' + bos_text + ':1' if add_bos else ''} $B:1{' ' + eos_text + ':1' if add_eos else ''}"
    special = [(text, i) for text, i in ((bos_text, bos_id), (eos_text, eos_id)) if i is not None]
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)


def _hf_chat_template(path: Path, config: dict) -> str | None:
    """chat_template.jinja if present, else tokenizer_config.json's (a string or a named list)."""
    if (path / "chat_template.jinja").is_file():
        return (path / "chat_template.jinja").read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {entry["name"]: entry["template"] for entry in template}
        return named.get("default")
    return template


def _token_id(backend: tokenizers.Tokenizer, token: str | dict | None) -> int | None:
    """Id of a special token given as text or as an AddedToken dict ({"content": ...})."""
    if isinstance(token, dict):
        token = token.get("content")
    return backend.token_to_id(token) if token else None


def _as_list(value: int | list[int] | None) -> list[int]:
    return [] if value is None else [value] if isinstance(value, int) else list(value)


def _read_json(path: Path) -> dict:
    """A JSON object file, {} if absent; a malformed one is an InputError."""
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:  # also UnicodeDecodeError
        raise InputError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def _write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file in the same folder and rename, so no reader sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
