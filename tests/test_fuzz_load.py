"""Fuzz in CI: a few hundred mutated tiny GGUFs and config.json files, loaded under a memory cap with a
timeout each. Every one must end as the project's one-line error or as a model whose logits are finite."""

from __future__ import annotations

import itertools
import re
import time
from pathlib import Path

import pytest

from config_mutate import config_mutants, write_tiny_hf_dir
from fuzz_harness import ACCEPTABLE, Case, run_cases, tally
from gguf_mutate import mutants
from kerneltriage.engine.gguf_header import read_header
from tiny_gguf import write_tiny_gguf

GGUF_CASES, CONFIG_CASES, SEED = 240, 60, 0
# Far more than a tiny model needs (~10 MB), far less than the huge sizes a mutated header claims.
CAP_BYTES = 1 << 30
TIMEOUT_S = 10.0
BUDGET_S = 60.0


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    root = tmp_path_factory.mktemp("fuzz")
    pristine = write_tiny_gguf(root / "tiny.gguf")
    data, header = pristine.read_bytes(), read_header(pristine)

    def gguf_cases():
        yield Case(pristine, "pristine tiny GGUF", None)
        for index, mutant in enumerate(mutants(data, header, GGUF_CASES, SEED)):
            path = root / f"mutant-{index}.gguf"
            path.write_bytes(mutant.data)
            yield Case(path, mutant.what, pristine, disposable=True)

    hf = write_tiny_hf_dir(root / "hf")
    hf_cases = [Case(hf, "pristine tiny HF folder")]
    hf_cases += [Case(path, what, disposable=True) for path, what in config_mutants(hf, root, CONFIG_CASES, SEED)]
    started = time.perf_counter()
    out = run_cases(itertools.chain(gguf_cases(), hf_cases), CAP_BYTES, TIMEOUT_S, root / "cache")
    out.append({"what": "total", "outcome": "loaded", "seconds": time.perf_counter() - started})
    return out


def test_every_case_is_a_clean_error_or_a_finite_model(results: list[dict]) -> None:
    bad = [r for r in results if r["outcome"] not in ACCEPTABLE]
    assert not bad, "\n".join(f"{r['outcome']}: {r['what']}: {r.get('message', '')}" for r in bad[:10])


def test_the_fuzz_exercised_both_outcomes(results: list[dict]) -> None:
    cases = results[:-1]
    assert cases[0]["outcome"] == "loaded" and cases[1 + GGUF_CASES]["outcome"] == "loaded"  # the pristine two
    counts = tally(cases)
    assert counts.get("input-error", 0) >= len(cases) // 3, counts
    assert counts.get("loaded", 0) >= 10, counts  # mutations that change nothing the model is built from


def test_every_error_names_the_file(results: list[dict]) -> None:
    """Which file an error is about (a target or its draft, one of many mutants): 201 of a long run's errors did
    not say. The cases are the pristine GGUF, the GGUF mutants in order, the pristine folder, its mutants."""
    cases = results[:-1]
    paths = [f"mutant-{index}.gguf" for index in range(GGUF_CASES)] + [f"hf-{index}" for index in range(CONFIG_CASES)]
    named = [(path, r) for path, r in zip(paths, cases[1:1 + GGUF_CASES] + cases[2 + GGUF_CASES:])]
    unnamed = [f"{r['what']}: {r['message']}" for path, r in named if r["outcome"] == "input-error"
               and not re.search(rf"{re.escape(path)}(?![0-9])", r["message"])]  # hf-1 is not hf-12
    assert len(named) == GGUF_CASES + CONFIG_CASES and not unnamed, "\n".join(unnamed[:10])


def test_the_fuzz_fits_in_its_budget(results: list[dict]) -> None:
    assert results[-1]["seconds"] < BUDGET_S
    # Every mutant answered within the 2 s (the pristine file first pays the tokenizer's conversion).
    assert max(r["seconds"] for r in results[1:-1]) < 2.0


def test_every_mutation_of_a_long_run_can_be_made(tmp_path: Path) -> None:
    """The long run's 2,000 cases (seed 1) on the tiny file: a mutator that cannot make its case would stop it."""
    pristine = write_tiny_gguf(tmp_path / "tiny.gguf")
    data, header = pristine.read_bytes(), read_header(pristine)
    described = [m.what for m in mutants(data, header, 2000, seed=1)]
    assert len(set(described)) > 1000  # mostly distinct cases, not one repeated
