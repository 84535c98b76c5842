"""`kerneltriage generate` as a new user meets it: an instruct model's chat template by default (--no-chat for the
prompt as written), a model without one said once, and a generation cut short saying where."""

from __future__ import annotations

import re

import pytest

from conftest import tiny_checkpoint
from kerneltriage.cli.main import main
from kerneltriage.engine import sources
from kerneltriage.engine.checkpoint import Checkpoint

TEMPLATE = "<u>{{ messages[0]['content'] }}</u>{% if add_generation_prompt %}<a>{% endif %}"
GENERATE = ["generate", "--model", "tiny", "--device", "cpu", "--backend", "torch", "--prompt", "hi"]


def _checkpoint(template: str | None, eos: tuple[int, ...] = ()) -> Checkpoint:
    """The tiny llama with a byte tokenizer that is not a preset's: a chat template (or none) and EOS ids."""
    checkpoint = tiny_checkpoint("llama")
    tokenizer = checkpoint.tokenizer
    tokenizer.chat_template, tokenizer.is_synthetic, tokenizer.eos_token_ids = template, False, eos
    tokenizer.source = checkpoint.source  # as a model file's tokenizer names its file
    return checkpoint


def _generate(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], checkpoint: Checkpoint,
              *argv: str) -> tuple[int, str]:
    monkeypatch.setattr(sources, "load_checkpoint", lambda spec, label=None: checkpoint)
    status = main([*GENERATE, *argv])
    return status, capsys.readouterr().err


def _prompt_tokens(err: str) -> int:
    return int(re.search(r"prompt (\d+) tok", err).group(1))


def test_the_chat_template_is_used_by_default_and_no_chat_turns_it_off(monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    status, err = _generate(monkeypatch, capsys, _checkpoint(TEMPLATE), "--max-tokens", "2")
    assert status == 0 and _prompt_tokens(err) == len("<u>hi</u><a>")  # bytes: the add_generation_prompt part too
    status, err = _generate(monkeypatch, capsys, _checkpoint(TEMPLATE), "--max-tokens", "2", "--no-chat")
    assert status == 0 and _prompt_tokens(err) == len("hi")
    assert "chat template" not in err


def test_a_model_without_a_template_completes_the_prompt_and_says_so_once(monkeypatch: pytest.MonkeyPatch,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    status, err = _generate(monkeypatch, capsys, _checkpoint(None), "--max-tokens", "2")
    assert status == 0 and _prompt_tokens(err) == len("hi")
    assert err.count("tiny-llama has no chat template: completing the prompt as written") == 1
    status, err = _generate(monkeypatch, capsys, _checkpoint(None), "--chat")
    assert status == 2 and "--chat needs a model with a chat template; tiny-llama has none" in err


def test_a_cut_generation_says_where_and_one_that_ended_does_not(monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    status, err = _generate(monkeypatch, capsys, _checkpoint(None), "--max-tokens", "3")
    assert status == 0 and err.count("stopped at --max-tokens 3 before the model ended its answer") == 1
    every_token_ends = tuple(range(300))  # the first token generated is an end of sequence
    status, err = _generate(monkeypatch, capsys, _checkpoint(None, every_token_ends), "--max-tokens", "3")
    assert status == 0 and "stopped at" not in err and "(1 tok)" in err
    status, err = _generate(monkeypatch, capsys, _checkpoint(None), "--no-chat", "--max-tokens", "100",
                            "--prompt", "x" * 120)
    assert status == 0 and "stopped at the model's context of 128 tokens" in err and "(8 tok)" in err
