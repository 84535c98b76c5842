"""Which constrained-decoding library should kerneltriage build on? llguidance, xgrammar and outlines-core, measured
on this machine: import time, the one-time tokenizer setup, time to the first mask (grammar compile + first mask) and
the per-token cost of a mask (and of consuming a token) along a valid output, for a choice, a regex and JSON schemas,
on each tokenizer given (SmolLM2's 49k vocabulary, Gemma-3's 262k).

Each library runs in its own interpreter (`--one LIB`): imports and caches do not leak between them. A library that
is not importable is reported as such, not skipped silently. Example (the libraries installed by `pip --target` into
folders of their own, so that their sizes can be read):

    python benchmarks/tools/grammar_libs.py --tokenizer smollm2=~/.cache/kerneltriage/converted/ID/tokenizer.json \
        --tokenizer gemma3=/tmp/gemma-tok/tokenizer.json --path llguidance=/tmp/cg/t/llguidance ... --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

LIBRARIES = ("llguidance", "xgrammar", "outlines-core")
PERSON = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string"},
    "active": {"type": "boolean"}, "role": {"enum": ["admin", "user", "guest"]},
    "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["name", "age", "email", "active", "role", "tags"], "additionalProperties": False}
ORDER = {"type": "object", "properties": {
    "id": {"type": "integer"}, "customer": {"type": "object", "properties": {
        "name": {"type": "string"}, "city": {"type": "string"}}, "required": ["name", "city"],
        "additionalProperties": False},
    "items": {"type": "array", "items": {"type": "object", "properties": {
        "sku": {"type": "string"}, "quantity": {"type": "integer"}, "price": {"type": "number"}},
        "required": ["sku", "quantity", "price"], "additionalProperties": False}},
    "paid": {"type": "boolean"}}, "required": ["id", "customer", "items", "paid"], "additionalProperties": False}
# (name, kind, constraint, a valid output): the output is tokenized as the model writes it and walked token by token
CASES = (
    ("choice", "regex", "(positive|negative|neutral)", "neutral"),
    ("regex", "regex", r"[A-Z][a-z]+ [A-Z][a-z]+, born \d{4}-\d{2}-\d{2}", "Ada Lovelace, born 1815-12-10"),
    ("json-person", "json", PERSON, json.dumps({"name": "Ada Lovelace", "age": 36, "email": "ada@example.org",
                                                "active": True, "role": "admin", "tags": ["math", "engines"]})),
    ("json-order", "json", ORDER, json.dumps({"id": 1042, "customer": {"name": "Grace Hopper", "city": "Arlington"},
                                              "items": [{"sku": "A-17", "quantity": 2, "price": 9.5},
                                                        {"sku": "B-3", "quantity": 1, "price": 120.25}],
                                              "paid": False})),
)


def token_bytes(tok: Any) -> list[bytes | None]:
    """Each id's bytes as the model writes them (None: a special token): byte-level BPE through GPT-2's byte map,
    sentencepiece through ▁ and <0xNN> byte fallback."""
    spec = json.loads(tok.to_str())
    special = {t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
    vocab = tok.get_vocab(with_added_tokens=True)
    byte_level = "ByteLevel" in json.dumps(spec.get("decoder"))
    unmap = {c: b for b, c in _gpt2_bytes().items()}
    out: list[bytes | None] = [None] * tok.get_vocab_size(with_added_tokens=True)
    for text, i in vocab.items():
        if i in special:
            continue
        if byte_level:
            out[i] = bytes(unmap[c] for c in text) if all(c in unmap for c in text) else text.encode()
        elif len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            out[i] = bytes([int(text[3:5], 16)])
        else:
            out[i] = text.replace("▁", " ").encode()
    return out


def _gpt2_bytes() -> dict[int, str]:
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    extra = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + n) for n, b in enumerate(extra)}}


class Lib:
    """One library behind four calls: setup(tokenizer) once, compile(kind, constraint) → a matcher factory,
    mask(matcher) → allowed count, consume(matcher, token)."""

    def __init__(self, name: str, tok: Any, eos: int) -> None:
        self.name, self.tok, self.eos = name, tok, eos
        self.vocab = tok.get_vocab_size(with_added_tokens=True)

    def setup(self) -> None:
        import numpy as np

        if self.name == "llguidance":
            import llguidance

            self.info = llguidance.LLTokenizer(self.tok.to_str(), n_vocab=self.vocab, eos_token=self.eos)
            self.words = np.zeros((self.vocab + 31) // 32, dtype=np.int32)
        elif self.name == "xgrammar":
            import xgrammar as xgr

            ids = token_bytes(self.tok)
            encoded = [b if b is not None else b"" for b in ids]
            info = xgr.TokenizerInfo(encoded, vocab_type=xgr.VocabType.RAW, vocab_size=self.vocab,
                                     stop_token_ids=[self.eos])
            self.compiler = xgr.GrammarCompiler(info, max_threads=2)
            self.words = xgr.allocate_token_bitmask(1, self.vocab)
        else:
            import outlines_core as oc

            table: dict[bytes, list[int]] = {}
            for i, b in enumerate(token_bytes(self.tok)):
                if b is not None and i != self.eos:
                    table.setdefault(b, []).append(i)
            self.info = oc.Vocabulary(self.eos, table)
            self.words = np.zeros((self.vocab + 31) // 32, dtype=np.int32)

    def compile(self, kind: str, constraint: Any) -> Callable[[], Any]:
        if self.name == "llguidance":
            import llguidance

            grammar = (llguidance.LLMatcher.grammar_from_regex(constraint) if kind == "regex"
                       else llguidance.LLMatcher.grammar_from_json_schema(json.dumps(constraint)))
            return lambda: llguidance.LLMatcher(self.info, grammar, log_level=0)
        if self.name == "xgrammar":
            import xgrammar as xgr

            compiled = (self.compiler.compile_regex(constraint) if kind == "regex"
                        else self.compiler.compile_json_schema(json.dumps(constraint), any_whitespace=False))
            return lambda: xgr.GrammarMatcher(compiled)
        import outlines_core as oc

        regex = constraint if kind == "regex" else oc.json_schema.build_regex_from_schema(json.dumps(constraint))
        index = oc.Index(regex, self.info)
        return lambda: oc.Guide(index)

    def mask(self, matcher: Any) -> None:
        if self.name == "llguidance":
            matcher.unsafe_compute_mask_ptr(self.words.ctypes.data, self.words.nbytes)
        elif self.name == "xgrammar":
            matcher.fill_next_token_bitmask(self.words)
        else:
            matcher.write_mask_into(self.words.ctypes.data, self.words.size, 4)

    def allowed(self, token: int) -> bool:
        word = self.words.view(-1)[token // 32] if self.name == "xgrammar" else self.words[token // 32]
        return bool((int(word) >> (token % 32)) & 1)

    def consume(self, matcher: Any, token: int) -> None:
        if self.name == "llguidance":
            ok = matcher.consume_token(token)
        elif self.name == "xgrammar":
            ok = matcher.accept_token(token)
        else:
            ok = matcher.advance(token, return_tokens=False) is None  # raises on a token it does not allow
        if ok is False:
            raise RuntimeError(f"{self.name} refused token {token}")


def walk(lib: Lib, fresh: Callable[[], Any], tokens: list[int]) -> tuple[list[float], list[float], int]:
    """Mask and consume along `tokens`, then mask once more (EOS must be allowed): seconds per mask and per consume,
    and the tokens the library allowed that the walk took (all of them, or the library disagrees with the output)."""
    matcher = fresh()
    masks, consumes, taken = [], [], 0
    for token in [*tokens, lib.eos]:
        began = time.perf_counter()
        lib.mask(matcher)
        masks.append(time.perf_counter() - began)
        taken += lib.allowed(token)
        if token == lib.eos:
            break
        began = time.perf_counter()
        lib.consume(matcher, token)
        consumes.append(time.perf_counter() - began)
    return masks, consumes, taken


def measure_one(name: str, tokenizers_: dict[str, str], repeats: int) -> dict[str, Any]:
    """Everything about library `name`, in this interpreter."""
    from tokenizers import Tokenizer

    began = time.perf_counter()
    try:
        __import__({"outlines-core": "outlines_core"}.get(name, name))
    except ImportError as exc:
        return {"library": name, "error": f"not importable: {exc}"}
    result: dict[str, Any] = {"library": name, "import_s": time.perf_counter() - began, "vocabularies": {}}
    for label, path in tokenizers_.items():
        tok = Tokenizer.from_file(path)
        eos = _eos(tok)
        lib = Lib(name, tok, eos)
        began = time.perf_counter()
        lib.setup()
        entry: dict[str, Any] = {"vocab": lib.vocab, "setup_s": time.perf_counter() - began, "cases": {}}
        for case, kind, constraint, text in CASES:
            tokens = tok.encode(text, add_special_tokens=False).ids
            began = time.perf_counter()
            fresh = lib.compile(kind, constraint)
            matcher = fresh()
            lib.mask(matcher)
            first = time.perf_counter() - began
            runs = [walk(lib, fresh, tokens) for _ in range(repeats)]
            masks = sorted(m for run in runs for m in run[0])
            consumes = sorted(c for run in runs for c in run[1])
            entry["cases"][case] = {
                "tokens": len(tokens), "first_mask_s": first, "mask_median_us": statistics.median(masks) * 1e6,
                "mask_mean_us": statistics.fmean(masks) * 1e6, "mask_p90_us": masks[int(0.9 * (len(masks) - 1))] * 1e6,
                "mask_max_us": masks[-1] * 1e6, "consume_median_us": statistics.median(consumes) * 1e6,
                "allowed_along_output": f"{runs[0][2]}/{len(tokens) + 1}"}
        result["vocabularies"][label] = entry
    return result


def _eos(tok: Any) -> int:
    for text in ("<|im_end|>", "<end_of_turn>", "<eos>", "<|endoftext|>", "</s>"):
        if tok.token_to_id(text) is not None:
            return tok.token_to_id(text)
    raise SystemExit("no end token found in the tokenizer")


def installed_mb(paths: dict[str, str]) -> dict[str, float]:
    """Megabytes under each library's --target folder (its own files and the dependencies it brought)."""
    return {name: sum(f.stat().st_size for f in Path(p).rglob("*") if f.is_file()) / 1e6 for name, p in paths.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", action="append", default=[], help="LABEL=tokenizer.json (repeatable)")
    parser.add_argument("--path", action="append", default=[], help="LIB=folder it was pip-installed into (--target)")
    parser.add_argument("--repeats", type=int, default=5, help="walks of each output (default: %(default)s)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure one library in this interpreter
    parser.add_argument("--out", help="write the JSON here")
    args = parser.parse_args()
    tokenizers_ = dict(item.split("=", 1) for item in args.tokenizer)
    if args.one:
        print(json.dumps(measure_one(args.one, tokenizers_, args.repeats)))
        return
    paths = dict(item.split("=", 1) for item in args.path)
    rows = []
    for name in LIBRARIES:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [paths.get(name), os.environ.get(
            "PYTHONPATH")]))}
        argv = [sys.executable, __file__, "--one", name, "--repeats", str(args.repeats),
                *[f"--tokenizer={t}" for t in args.tokenizer]]
        done = subprocess.run(argv, env=env, capture_output=True, text=True)
        rows.append(json.loads(done.stdout) if done.returncode == 0 else
                    {"library": name, "error": done.stderr.strip().splitlines()[-1:]})
        print(json.dumps(rows[-1]), file=sys.stderr)
    from kerneltriage.core.environment import capture_environment

    report = {"libraries": rows, "installed_mb": installed_mb(paths), "load": os.getloadavg(),
              "environment": capture_environment()}
    text = json.dumps(report, indent=1)
    Path(args.out).write_text(text) if args.out else print(text)


if __name__ == "__main__":
    main()
