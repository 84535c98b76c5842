"""Resolve `--model` (default | a published model | preset name | GGUF file | HF safetensors folder) into a
Checkpoint."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from kerneltriage.core.errors import InputError
from kerneltriage.engine.checkpoint import Checkpoint, RawTensor
from kerneltriage.engine.config import ModelConfig
from kerneltriage.engine.preflight import check_model_spec
from kerneltriage.engine.presets import PRESETS, get_preset
from kerneltriage.engine.tokenizer import Tokenizer
from kerneltriage.engine.validate import check_tensors

DEFAULT = "default"


def load_checkpoint(spec: str = DEFAULT, label: str | None = None) -> Checkpoint:
    """What `--model SPEC` names, read and validated (weights stay memory-mapped until a backend loads them);
    `label` is how errors about the spec itself name it (default `--model 'SPEC'`)."""
    check_model_spec(spec, label)
    if spec in PRESETS:
        return _from_preset(spec)
    from kerneltriage.engine.fetch import PUBLISHED, published_model_path

    if spec in PUBLISHED:  # default among them
        path = published_model_path(PUBLISHED[spec])
    else:
        path = Path(spec).expanduser()
    with _naming(path):
        return _from_hf_dir(path) if path.is_dir() else _from_gguf(path)


@contextmanager
def _naming(path: Path) -> Iterator[None]:
    """Every error about a model's contents names its file: a header's value or a tokenizer's key alone does not
    say which of two models (a target and its draft) or of many files (a fuzz run) it came from."""
    try:
        yield
    except InputError as exc:
        if str(path) in str(exc):
            raise
        raise InputError(f"{path}: {exc}") from exc


def _from_preset(name: str) -> Checkpoint:
    config = get_preset(name)
    return Checkpoint(config, {}, Tokenizer.synthetic(config.vocab_size), source=f"preset {name} (random weights)")


def _from_gguf(path: Path) -> Checkpoint:
    """Header → config → every size checked against the tensors present → tokenizer → tensors: nothing is
    converted, cached or allocated for a file whose header does not match its tensors."""
    from kerneltriage.engine import names
    from kerneltriage.engine.converted import record_source
    from kerneltriage.engine.gguf_file import gguf_to_internal, read_gguf
    from kerneltriage.engine.gguf_keys import check_key_names
    from kerneltriage.engine.paths import converted_dir

    contents = read_gguf(path)
    config = ModelConfig.from_gguf(contents.meta, "output.weight" in contents.tensors, name=path.stem)
    check_key_names(path, contents.meta, config.arch)
    check_tensors(str(path), config, _gguf_shapes(path, contents.tensors, config.arch), names.GGUF)
    cache = converted_dir(path)
    tokenizer = Tokenizer.from_gguf(path, contents.meta, cache=cache)
    _check_vocabulary(path, tokenizer, config)
    record_source(cache, path)
    for note in tokenizer.notes:  # a fallback for a key the file lacks, said once
        print(note, file=sys.stderr)
    return Checkpoint(config, gguf_to_internal(contents, config), tokenizer, source=str(path),
                      chat_template=tokenizer.chat_template)


def _gguf_shapes(path: Path, tensors: Mapping[str, RawTensor], arch: str) -> dict[str, tuple[int, ...]]:
    """Internal name → shape of every tensor. One that is no weight of the model is an error, as in llama.cpp
    ("wrong number of tensors"): a flipped byte made `output.weight` `octput.weight`, and the model, its head out of
    sight, tied its embeddings without a word."""
    from kerneltriage.engine import names

    internal = {name: names.to_internal(name, names.GGUF) for name in tensors}
    unused = [name for name, key in internal.items() if key is None]
    if unused:
        more = f" (and {len(unused) - 1} more)" if len(unused) > 1 else ""
        raise InputError(f"{path}: tensor {unused[0]!r}{more} is no weight of a {arch} model; expected only its "
                         "weights (a flipped byte in a name reads so; llama.cpp refuses such a file too)")
    return {key: tensors[name].shape for name, key in internal.items() if key is not None}


def _from_hf_dir(path: Path) -> Checkpoint:
    from kerneltriage.engine import names
    from kerneltriage.engine.safetensors_dir import read_safetensors_dir

    hf_config, tensors = read_safetensors_dir(path)
    config = ModelConfig.from_hf(hf_config, name=path.name)
    if "lm_head" not in tensors and not config.tie_embeddings:
        config = config.replace(tie_embeddings=True)
    check_tensors(str(path), config, {name: raw.shape for name, raw in tensors.items()}, names.HF)
    tokenizer = Tokenizer.from_hf_dir(path)
    _check_vocabulary(path, tokenizer, config)
    return Checkpoint(config, tensors, tokenizer, source=str(path), chat_template=tokenizer.chat_template)


def _check_vocabulary(path: Path, tokenizer: Tokenizer, config: ModelConfig) -> None:
    """Every id the tokenizer can produce must have an embedding row (a model may have spare rows)."""
    if tokenizer.vocab_size > config.vocab_size:
        raise InputError(f"{path}: its tokenizer has {tokenizer.vocab_size:,} tokens but the model embeds only "
                         f"{config.vocab_size:,}")
