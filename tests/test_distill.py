"""`kerneltriage distill` on the real default model (CPU, a few steps): the draft learns the target, its folder
loads as a draft model with the target's vocabulary, and speculation with it keeps greedy tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import tiny_checkpoint
from kerneltriage.backends.torch.backend import BACKEND, build_runner
from kerneltriage.cli.main import main
from kerneltriage.core.errors import InputError
from kerneltriage.engine.configuration import RunConfig
from kerneltriage.engine.generation import generate_step
from kerneltriage.engine.sampling import SamplingParams
from kerneltriage.engine.sources import load_checkpoint
from kerneltriage.engine.speculative.config import check_same_vocabulary, parse_speculation
from kerneltriage.train import distill


@pytest.fixture(scope="module")
def trained(default_checkpoint, tmp_path_factory, shared_answers):  # noqa: ANN001, ANN201
    target = build_runner(default_checkpoint, torch.device("cpu"), torch.float32)
    prompts, held_out = distill.PROMPTS, distill.HELD_OUT
    distill.PROMPTS, distill.HELD_OUT = prompts[:5] + prompts[-2:], 2  # 5 to train on, 2 held out: seconds, not minutes
    try:
        with shared_answers():
            student, report = distill.distill(target, layers=2, steps=25, continuation=24)
    finally:
        distill.PROMPTS, distill.HELD_OUT = prompts, held_out
    folder = tmp_path_factory.mktemp("draft")
    distill.save_folder(student, folder)
    return target, student, report, folder


def test_the_draft_learns_the_target(trained) -> None:  # noqa: ANN001
    _, _, report, _ = trained
    assert report.sequences == 5 and report.layers == 2
    assert report.kl_last < 0.3 * report.kl_first, report  # 25 steps: 19.6 → 4.6 nats per answer position here
    # over the held-out answers only (48 positions; not the prompts' template text): 4% → 10% here
    assert report.agreement_after > report.agreement_before + 0.04, report


def test_the_folder_loads_as_a_draft_model_of_the_same_vocabulary(trained) -> None:  # noqa: ANN001
    target, student, _, folder = trained
    draft = load_checkpoint(str(folder))
    assert draft.config.num_layers == 2 and draft.config.hidden_size == target.config.hidden_size
    check_same_vocabulary(target.checkpoint, draft)  # raises on a mismatch
    assert draft.tokenizer.eos_token_ids == target.checkpoint.tokenizer.eos_token_ids
    stored = draft.tensors["layers.1.down"].data  # bf16 bit patterns
    trained_down = student.model.layers[1].mlp.down_proj.weight.to(torch.bfloat16)
    assert np.array_equal(stored, trained_down.view(torch.int16).numpy().view(np.uint16))


def test_speculation_with_the_draft_keeps_greedy_tokens(trained) -> None:  # noqa: ANN001
    target, _, _, folder = trained
    prompt = target.checkpoint.tokenizer.encode("Name three rivers in Europe:")
    expected = list(generate_step(target, prompt, SamplingParams(), 16))
    runner = BACKEND.build(target.checkpoint, RunConfig((), parse_speculation(f"draft:{folder}", "2")), "cpu",
                           "float32")
    assert list(generate_step(runner, prompt, SamplingParams(), 16)) == expected
    assert runner.speculation.stats.verify_steps > 0


def test_bad_inputs_fail_before_loading_and_write_nothing(tmp_path, capsys) -> None:  # noqa: ANN001
    with pytest.raises(InputError, match="expected 1..1"):
        distill.student_checkpoint(tiny_checkpoint("llama"), 2)  # 2 layers: a draft must have fewer
    file = tmp_path / "taken"
    file.write_text("")
    assert main(["distill", "--out", str(file), "--device", "cpu"]) == 2
    assert "is not a folder" in capsys.readouterr().err and file.read_text() == ""
    assert main(["distill", "--model", "smollm2-135m", "--out", str(tmp_path / "d")]) == 2
    assert "random weights" in capsys.readouterr().err and not (tmp_path / "d").exists()


def test_a_backend_without_a_trainer_is_refused(capsys) -> None:  # noqa: ANN001
    pytest.importorskip("mlx.core")
    assert main(["distill", "--backend", "mlx", "--device", "cpu", "--model", "smollm2-135m"]) == 2
    assert "--backend mlx: it cannot train drafters" in capsys.readouterr().err
