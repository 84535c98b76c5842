"""The EAGLE-style head (`--spec eagle[:PATH]`, `distill --eagle`): the target's hidden states reach the head by
position, an incremental draft equals one computed from scratch, speculation with a head keeps greedy tokens and
samples validly, training on the real model teaches the head, and bad heads are one-line errors."""

from __future__ import annotations

import pytest
import torch

from conftest import ARCHS, tiny_checkpoint
from kerneltriage.backends.torch import eagle
from kerneltriage.backends.torch.backend import BACKEND, build_runner
from kerneltriage.backends.torch.cache import KVCache
from kerneltriage.cli.main import main
from kerneltriage.core.errors import InputError
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.generation import generate_step
from kerneltriage.engine.sampling import SamplingParams
from kerneltriage.engine.speculative import drafters
from kerneltriage.engine.speculative.config import parse_speculation
from kerneltriage.train import distill
from kerneltriage.train import eagle as eagle_train

GREEDY = SamplingParams()
PROMPT = [210, 158, 247, 186, 114, 261] * 2
NEW = 40


def tiny_head(arch: str, tmp_path, seed: int = 1):  # noqa: ANN001, ANN201
    """A randomly initialised head for the tiny `arch` model, saved; its path."""
    torch.manual_seed(seed)
    target = build_runner(tiny_checkpoint(arch), torch.device("cpu"), torch.float32)
    head = eagle.EagleHead(target.model, "cpu")
    path = tmp_path / f"{arch}.safetensors"
    eagle.save_head(head, path)
    return path


def eagle_runner(arch: str, path, depth: str = "3"):  # noqa: ANN001, ANN201
    return BACKEND.build(tiny_checkpoint(arch), RunConfig((), parse_speculation(f"eagle:{path}", depth)), "cpu",
                         "float32")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("depth", ["3", "auto"])
def test_speculation_with_a_head_keeps_greedy_tokens(arch: str, depth: str, tmp_path) -> None:  # noqa: ANN001
    expected = list(generate_step(build_runner(tiny_checkpoint(arch), torch.device("cpu"), torch.float32), PROMPT,
                                  GREEDY, NEW))
    runner = eagle_runner(arch, tiny_head(arch, tmp_path), depth)
    assert list(generate_step(runner, PROMPT, GREEDY, NEW)) == expected
    if depth == "3":
        assert runner.speculation.stats.verify_steps >= 5


def test_the_store_holds_each_positions_hidden_state_and_drafts_equal_a_fresh_heads(tmp_path) -> None:  # noqa: ANN001
    """After a run with rejections (verify rows past the accepted ones written and then dropped), every position
    before the last token holds the hidden state a fresh forward over the text computes, and the drafter's
    incremental draft (its cache kept across steps, trimmed to the true features' rows) is the draft of a fresh
    drafter fed the whole text at once."""
    path = tiny_head("llama", tmp_path)
    runner = eagle_runner("llama", path)
    context = PROMPT + list(generate_step(runner, PROMPT, GREEDY, NEW))
    drafter = runner.speculation.drafter
    assert runner.speculation.stats.verify_steps >= 5 and runner.speculation.stats.acceptance < 1  # rejections
    fresh = build_runner(tiny_checkpoint("llama"), torch.device("cpu"), torch.float32)
    fresh.model.cache = KVCache(fresh.model.cache_shape(len(context)), fresh.device, torch.float32)
    with torch.inference_mode():
        hidden = fresh.model.hidden(fresh.tensor(context[:-1]), 0)[0]
    stored = drafter.store.features[:len(context) - 1]
    torch.testing.assert_close(stored, hidden, rtol=1e-5, atol=1e-5)
    sampler = runner.sampler(GREEDY, context)
    incremental = drafter.draft(context, 4, sampler).tokens.tolist()
    scratch = eagle.EagleDrafter(runner, eagle.load_head(path, runner.model, torch.float32))
    scratch.store.features, scratch.store.cache = drafter.store.features, drafter.store.cache
    scratch.reset(runner, len(context))
    assert scratch.draft(context, 4, sampler).tokens.tolist() == incremental


def test_sampled_speculation_with_a_head_is_seeded_and_valid(tmp_path) -> None:  # noqa: ANN001
    path = tiny_head("qwen2", tmp_path)
    params = SamplingParams(temperature=0.8, seed=3)
    first = list(generate_step(eagle_runner("qwen2", path), PROMPT, params, NEW))
    runner = eagle_runner("qwen2", path)
    assert list(generate_step(runner, PROMPT, params, NEW)) == first
    assert len(first) == NEW and all(0 <= t < runner.config.vocab_size for t in first)
    assert runner.speculation.stats.verify_steps >= 5


def test_bad_heads_are_one_line_input_errors(tmp_path, capsys) -> None:  # noqa: ANN001
    runner = build_runner(tiny_checkpoint("llama"), torch.device("cpu"), torch.float32)
    with pytest.raises(InputError, match="no such head file"):
        eagle.load_head(tmp_path / "missing.safetensors", runner.model, torch.float32)
    text = tmp_path / "text.safetensors"
    text.write_text("not a tensor file")
    with pytest.raises(InputError, match="not a safetensors file"):
        eagle.load_head(text, runner.model, torch.float32)
    from safetensors.torch import save_file

    plain = tmp_path / "plain.safetensors"
    save_file({"x": torch.zeros(2)}, str(plain))
    with pytest.raises(InputError, match="not an EAGLE head"):
        eagle.load_head(plain, runner.model, torch.float32)
    other = tiny_head("qwen3", tmp_path)  # another architecture's head (per-head norms, other shapes)
    with pytest.raises(InputError, match="trained for .* arch qwen3 \\(the model: llama\\)"):
        eagle.load_head(other, runner.model, torch.float32)
    assert main(["generate", "--model", "smollm2-135m", "--device", "cpu", "--spec", f"eagle:{plain}",
                 "--max-tokens", "2", "--prompt", "hello"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not an EAGLE head" in err[0]
    with pytest.raises(InputError, match="eagle\\[:PATH\\]"):
        parse_speculation("eagle:")


def test_a_backend_without_heads_refuses_eagle() -> None:
    speculation = parse_speculation("eagle", None)
    with pytest.raises(InputError, match="torch backend only"):
        drafters.build_drafter(speculation, None, lambda layers: None, lambda checkpoint: None)


@pytest.fixture(scope="module")
def trained(default_checkpoint, tmp_path_factory, shared_answers):  # noqa: ANN001, ANN201
    target = build_runner(default_checkpoint, torch.device("cpu"), torch.float32)
    prompts, held_out = distill.PROMPTS, distill.HELD_OUT
    distill.PROMPTS, distill.HELD_OUT = prompts[:5] + prompts[-2:], 2  # 5 to train on, 2 held out: seconds
    torch.manual_seed(0)
    try:
        with shared_answers():
            head, report = eagle_train.train_head(target, steps=40, continuation=24, prompts=distill.PROMPTS[:5])
    finally:
        distill.PROMPTS, distill.HELD_OUT = prompts, held_out
    path = tmp_path_factory.mktemp("eagle") / "head.safetensors"
    eagle.save_head(head, path)
    return target, head, report, path


@pytest.mark.real_model
def test_the_head_learns_the_target(trained) -> None:  # noqa: ANN001
    _, _, report, _ = trained
    assert report.sequences == 5 and report.agreement_before < 0.05
    assert report.kl_last < 0.5 * report.kl_first, report
    assert report.agreement_after > report.agreement_before + 0.05, report


@pytest.mark.real_model
def test_the_saved_head_loads_and_speculates_without_changing_greedy_tokens(trained) -> None:  # noqa: ANN001
    target, head, _, path = trained
    loaded = eagle.load_head(path, target.model, torch.float32)
    assert torch.equal(loaded.fc.weight, head.fc.weight.to(torch.bfloat16).float())
    prompt = target.checkpoint.tokenizer.encode("Name three rivers in Europe:")
    expected = list(generate_step(target, prompt, GREEDY, 16))
    runner = BACKEND.build(target.checkpoint, RunConfig((), parse_speculation(f"eagle:{path}", "2")), "cpu",
                           "float32")
    assert list(generate_step(runner, prompt, GREEDY, 16)) == expected
    assert runner.speculation.stats.verify_steps > 0


def test_distill_eagle_refuses_bad_inputs_and_writes_nothing(tmp_path, capsys) -> None:  # noqa: ANN001
    out = tmp_path / "head.bin"
    assert main(["distill", "--eagle", "--device", "cpu", "--out", str(out)]) == 2
    assert "expected a .safetensors file" in capsys.readouterr().err and not out.exists()
    assert main(["distill", "--eagle", "--dtype", "bf16", "--out", str(tmp_path / "h.safetensors")]) == 2
    assert "trains on the target's float32 features" in capsys.readouterr().err
    assert main(["distill", "--eagle", "--model", "smollm2-135m", "--out", str(tmp_path / "h.safetensors")]) == 2
    assert "random weights" in capsys.readouterr().err and not (tmp_path / "h.safetensors").exists()
