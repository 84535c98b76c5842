"""Every bad input the reliability issue tried, run through the command line: exit status, the error line, seconds.

Usage: python benchmarks/tools/bad_inputs.py [--out benchmarks/results/bad-inputs-cpu.json]
Header cases are one-field mutations of the real default model (benchmarks/tools/fuzzkit/gguf_mutate.py);
config.json cases mutate a tiny Hugging Face folder (benchmarks/tools/fuzzkit/config_mutate.py). Each command runs in
a fresh process with a private cache, as a new user would run it; seconds include Python's start-up and any torch
import.
Prints the Markdown table docs/reliability.md carries.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent / "fuzzkit"))  # the mutators and the fuzz harness

from config_mutate import CONFIG, write_tiny_hf_dir  # noqa: E402
from gguf_mutate import set_scalar, set_tensor_field, set_value_type  # noqa: E402

from kerneltriage.core.environment import capture_environment  # noqa: E402
from kerneltriage.engine.fetch import default_model_path  # noqa: E402
from kerneltriage.engine.gguf_header import GGUFHeader, read_header  # noqa: E402

SRC = Path(__file__).resolve().parents[2] / "src"
Mutation = Callable[[bytes, GGUFHeader], bytes]


def _array_of(key: str, length: int) -> Mutation:
    """`key`'s value type rewritten to an array of `length` uint8 (gguf-py's reader looped forever on this)."""
    def mutate(data: bytes, header: GGUFHeader) -> bytes:
        out = bytearray(set_value_type(data, header, key, 9))
        struct.pack_into("<IQ", out, header.value_type_at[key] + 4, 0, length)
        return bytes(out)
    return mutate


def _second_tensor(header: GGUFHeader) -> tuple[str, int, int]:
    """(name, relative offset) of the second tensor in the file, and the first one's relative offset."""
    first, second = sorted(header.tensors, key=lambda t: t.offset)[:2]
    return second.name, second.offset - header.data_offset, first.offset - header.data_offset


HEADER_CASES: dict[str, Mutation] = {
    "llama.block_count = 2,949,150 (one flipped byte)": lambda d, h: set_scalar(d, h, "llama.block_count", 2_949_150),
    "llama.embedding_length = 2^31-1": lambda d, h: set_scalar(d, h, "llama.embedding_length", 2**31 - 1),
    "llama.feed_forward_length = 2^31-1": lambda d, h: set_scalar(d, h, "llama.feed_forward_length", 2**31 - 1),
    "llama.vocab_size = 2^31-1": lambda d, h: set_scalar(d, h, "llama.vocab_size", 2**31 - 1),
    "llama.attention.head_count = 0": lambda d, h: set_scalar(d, h, "llama.attention.head_count", 0),
    "llama.rope.freq_base = NaN": lambda d, h: set_scalar(d, h, "llama.rope.freq_base", float("nan")),
    "llama.rope.freq_base = inf": lambda d, h: set_scalar(d, h, "llama.rope.freq_base", float("inf")),
    "llama.attention.layer_norm_rms_epsilon = NaN":
        lambda d, h: set_scalar(d, h, "llama.attention.layer_norm_rms_epsilon", float("nan")),
    "llama.context_length = 2^31-1": lambda d, h: set_scalar(d, h, "llama.context_length", 2**31 - 1),
    "value type of llama.block_count rewritten (array of 2^40)": _array_of("llama.block_count", 2**40),
    "tensor offset onto another tensor":
        lambda d, h: set_tensor_field(d, h, _second_tensor(h)[0], "offset", _second_tensor(h)[2]),
    "tensor offset off the 32-byte alignment":
        lambda d, h: set_tensor_field(d, h, _second_tensor(h)[0], "offset", _second_tensor(h)[1] + 4),
    "tensor type rewritten to a smaller one (Q8_0 → Q4_0)":
        lambda d, h: set_tensor_field(d, h, "token_embd.weight", "type", 2),
    "file truncated in the tensor data": lambda d, h: d[: len(d) - 1_000_000],
    "file truncated in the header": lambda d, h: d[:500_000],
}
CONFIG_CASES = {"config.json num_attention_heads = 0": {"num_attention_heads": 0},
                "config.json vocab_size = null": {"vocab_size": None},
                "config.json rms_norm_eps = NaN": {"rms_norm_eps": float("nan")}}


class Runner:
    """Runs `kerneltriage ARGS` as a user would, with a private cache; records each case."""

    def __init__(self, work: Path) -> None:
        self.work, self.rows = work, []
        self.env = {**os.environ, "PYTHONPATH": str(SRC), "KERNELTRIAGE_CACHE": str(work / "cache"),
                    "COLUMNS": "100"}

    def case(self, name: str, *args: str, success: str = "") -> dict:
        """Run one case; `success` says what a zero exit means for it (the table's text for that row)."""
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "kerneltriage", *args], capture_output=True, text=True,
                              env=self.env, timeout=600, cwd=self.work)
        seconds = time.perf_counter() - started
        lines = done.stderr.strip().splitlines()
        errors = [line for line in lines if line.startswith("kerneltriage: error: ")]
        line = errors[-1] if errors else (success if done.returncode == 0 else lines[-1])
        row = {"input": name, "command": " ".join(["kerneltriage", *args]).replace(str(self.work), "$TMP"),
               "exit": done.returncode, "stderr_lines": len(lines), "traceback": "Traceback" in done.stderr,
               "line": line.replace(str(self.work), "$TMP"), "seconds": round(seconds, 2)}
        self.rows.append(row)
        print(f"{row['exit']}  {row['seconds']:6.2f} s  {name}: {row['line'][:110]}", flush=True)
        return row


def header_cases(run: Runner, model: Path) -> None:
    data, header = model.read_bytes(), read_header(model)
    for name, mutate in HEADER_CASES.items():
        path = run.work / "mutant.gguf"
        path.write_bytes(mutate(data, header))
        run.case(name, "generate", "--model", str(path), "--prompt", "hi", "--device", "cpu")
    path.unlink()


def config_cases(run: Runner) -> None:
    for name, change in CONFIG_CASES.items():
        folder = write_tiny_hf_dir(run.work / "hf")
        (folder / "config.json").write_text(json.dumps({**CONFIG, **change}))
        run.case(name, "generate", "--model", str(folder), "--prompt", "hi", "--device", "cpu")
        shutil.rmtree(folder)


def argument_cases(run: Runner, model: Path) -> None:
    gen = ("generate", "--model", str(model), "--device", "cpu")
    run.case("--stop ''", *gen, "--prompt", "hi", "--stop", "")
    run.case("--max-tokens 0", *gen, "--prompt", "hi", "--max-tokens", "0")
    run.case("empty prompt", *gen, "--prompt", "")
    run.case("unknown lever", *gen, "--prompt", "hi", "--levers", "warp_drive")
    run.case("unknown preset", "generate", "--model", "llama9-70b", "--prompt", "hi")
    run.case("prompt longer than the context", "generate", "--model", "smollm2-135m", "--prompt", "x" * 9000,
             "--device", "cpu")
    run.case("--debug after the subcommand (a traceback, as asked)", "ledger", "list", "--debug", "--ledger",
             "absent.db")
    run.case("llama3-8b preset on the CPU in float32 (memory pre-check)", "generate", "--model", "llama3-8b",
             "--prompt", "hi", "--device", "cpu")
    run.case("--device cuda without a GPU", "generate", "--model", "smollm2-135m", "--prompt", "hi", "--device",
             "cuda")
    run.case("missing model file", "generate", "--model", "absent.gguf", "--prompt", "hi")
    run.case("--version", "--version", success="kerneltriage 0.1.0")


def ledger_cases(run: Runner) -> None:
    (run.work / "notes.db").write_text("not a database\n" * 100)
    run.case("a text file as --ledger", "ledger", "list", "--ledger", "notes.db")
    folder = run.work / "ro"
    folder.mkdir()
    write = "from kerneltriage.core.ledger import Ledger\nwith Ledger('ro/l.db') as l:\n    " \
            "with l.experiment('bench', {}, {}, label='x'): pass\n"
    subprocess.run([sys.executable, "-c", write], env=run.env, cwd=run.work, check=True)
    # The immutable attribute holds even for root (who ignores modes); elsewhere the mode does it.
    immutable = os.geteuid() == 0 and subprocess.run(["chattr", "+i", str(folder)]).returncode == 0
    if not immutable:
        folder.chmod(0o555)
    try:
        run.case("ledger list, ledger in a read-only folder", "ledger", "list", "--ledger", "ro/l.db",
                 success="lists its experiment (read as it stands, without a -shm file)")
        run.case("triage --ledger in a read-only folder", "triage", "--model", "smollm2-135m", "--device", "cpu",
                 "--ledger", "ro/new.db")
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        else:
            folder.chmod(0o755)


def tokenizer_cache_case(run: Runner, model: Path) -> None:
    args = ("generate", "--model", str(model), "--prompt", "hi", "--max-tokens", "2", "--device", "cpu")
    run.case("first run (converts and caches the tokenizer)", *args, success="generates")
    cached = next((run.work / "cache" / "converted").glob("*/tokenizer.json"))
    cached.write_text(cached.read_text()[:1000])
    run.case("cached tokenizer.json truncated", *args, success="converts the tokenizer again and generates")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/bad-inputs-cpu.json"))
    args = parser.parse_args()
    model = default_model_path()
    with tempfile.TemporaryDirectory(prefix="kt-bad-") as tmp:
        run = Runner(Path(tmp))
        copy = run.work / "SmolLM2-135M-Instruct.Q4_1.gguf"
        shutil.copy(model, copy)
        header_cases(run, copy)
        config_cases(run)
        argument_cases(run, copy)
        ledger_cases(run)
        tokenizer_cache_case(run, copy)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"environment": capture_environment(), "cases": run.rows}, indent=2) + "\n")
    print("\n| input | exit | what it gets | s |\n|---|---|---|---|")
    for row in run.rows:
        line = row["line"].removeprefix("kerneltriage: error: ").replace("|", "\\|")
        print(f"| {row['input']} | {row['exit']} | {line} | {row['seconds']:.1f} |")


if __name__ == "__main__":
    main()
