"""Training an EAGLE-style head (backends/torch/eagle.py) on a torch runner by self-distillation: on the target's
answers to distill.py's built-in training prompts and the further ones here (none from benchmarks/prompts/) —
greedy, and `samples` more each drawn at SAMPLE_TEMPERATURE (a head has many more weights than those prompts' greedy
answers have positions: 20 of them overfit it, 21% held-out agreement at 400 steps on the CPU while its training KL
fell to 0.8) — the head is fed the target's true features f_j with the tokens t_{j+1} that followed
(slightly noised, so it learns to continue from its own imperfect predictions too) and trained to predict f_{j+1}:
KL(target ‖ head) between lm_head(f_{j+1}) and lm_head(the prediction) — the next token's distribution, what a
verify accepts — plus a smooth-L1 pull towards f_{j+1} itself (EAGLE's two losses). Only the answers' rows count
(the prompts' chat-template text would flatter it), and the held-out prompts' answers give the top-1 agreement with
the target: draft position 1's acceptance at temperature 0.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from kerneltriage.backends.torch.eagle import EagleHead
from kerneltriage.backends.torch.runner import Runner
from kerneltriage.core.errors import InputError
from kerneltriage.engine.sampling import SamplingParams
from kerneltriage.train import distill
from kerneltriage.train.distill import Answered, Progress, Unstored

LEARNING_RATE = 1e-3
FEATURE_LOSS = 1.0  # weight of the smooth-L1 feature loss beside the KL (per feature, in units of the features' RMS)
NOISE = 0.2  # uniform noise on the input features, ± half this times their RMS (EAGLE trains through noise too)
SAMPLE_TEMPERATURE = 0.8  # the sampled answers' temperature: varied text that is still the target's own
# Training prompts beside distill.PROMPTS's: more kinds of request (code, data, prose, lists), none of
# benchmarks/prompts/'s tasks.
EXTRA_PROMPTS = (
    "Write a Python class for a stack with push, pop and peek.",
    "Explain the difference between TCP and UDP in a few sentences.",
    "Write a short story about a cat who learns to swim.",
    "List ten fruits and their typical colours.",
    "Convert this list to a JSON array of objects with keys city and country: Paris France, Lima Peru, Oslo Norway.",
    "Write a Go function that returns the maximum of a slice of ints.",
    "Describe a typical day of a baker.",
    "Give step-by-step instructions to change a flat bicycle tyre.",
    "Write a Markdown table of three programming languages and the year each appeared.",
    "Explain what a mortgage is.",
    "Write a Java method that checks whether a string is a palindrome.",
    "Write a polite reply declining a meeting invitation.",
    "What are the benefits of drinking water?",
    "Write an HTML page with a heading and a list of three links.",
    "Describe how a refrigerator keeps food cold.",
    "Write a Python script that counts the lines in a file.",
    "List the days of the week in Spanish and English.",
    "Explain the rules of chess for the knight and the bishop.",
    "Write a CSS rule that centers a div horizontally and vertically.",
    "Give five ideas for a birthday party for an eight-year-old.",
    "Write a limerick about a programmer and a bug.",
    "Explain what an API is with an example.",
    "Write a TypeScript interface for a user with a name, an email and an optional age.",
    "Summarize the plot of Romeo and Juliet.",
    "Write a YAML file that configures a web server with a host, a port and two routes.",
    "What is machine learning?",
    "Write a shell command that finds the ten largest files in a directory.",
    "Describe the life cycle of a butterfly.",
    "Write a C++ function that swaps two integers by reference.",
    "Give a short history of the bicycle.",
    "Write a numbered list of steps to make a cup of tea.",
    "Explain why the sky gets dark at night.",
)


@dataclass
class HeadReport:
    steps: int
    sequences: int  # training sequences (prompt + the target's continuation)
    kl_first: float  # mean KL over the first tenth of the steps (nats per answer position)
    kl_last: float  # … over the last tenth
    agreement_before: float  # top-1 agreement with the target over the held-out answers, untrained
    agreement_after: float
    seconds: float
    path: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Example:
    """One sequence's training pairs: features f_0…f_{T-2} and tokens t_1…t_{T-1}; the targets f_1…f_{T-1}; from
    `first` on, the rows that predict the answer's tokens."""

    features: torch.Tensor  # (1, T-1, H)
    tokens: torch.Tensor  # (1, T-1)
    targets: torch.Tensor  # (T-1, H)
    first: int


def _example(target: Runner, sequence: Answered) -> _Example:
    tokens = torch.tensor([sequence.tokens], device=target.device)
    model = target.model
    model.cache = Unstored(len(sequence.tokens), target.device)
    try:
        with torch.no_grad():
            features = model.hidden(tokens, 0).float()  # (1, T, H)
    finally:
        model.cache = None
    # the pair at j predicts f_{j+1}, whose logits predict t_{j+2}: the answer's first token t_start at j = start - 2
    return _Example(features[:, :-1], tokens[:, 1:], features[0, 1:], max(sequence.start - 2, 0))


def _predict(head: EagleHead, example: _Example, noise: float) -> torch.Tensor:
    features = example.features
    if noise:
        scale = features.pow(2).mean().sqrt()
        features = features + (torch.rand_like(features) - 0.5) * noise * scale
    head.cache = Unstored(features.shape[1], features.device)
    try:
        return head(features, example.tokens, 0)[0, example.first:]  # (rows, H)
    finally:
        head.cache = None


def agreement(head: EagleHead, examples: list[_Example]) -> float:
    """Where the head's top token (from true features) is the target's, over the answers' rows."""
    hits = total = 0
    with torch.no_grad():
        for example in examples:
            draft = head.logits(_predict(head, example, 0.0)).argmax(-1)
            teacher = head.logits(example.targets[example.first:]).argmax(-1)
            hits += int((draft == teacher).sum())
            total += len(teacher)
    return hits / total


def train_head(target: Runner, steps: int, continuation: int, samples: int = 0,
               prompts: Sequence[str] | None = None, progress: Progress = lambda line: None
               ) -> tuple[EagleHead, HeadReport]:
    """A head trained for `steps` steps (one sequence each, float32, on the target's device) on the target's
    `continuation`-token answers to `prompts` (default: distill.PROMPTS but the held-out ones, and EXTRA_PROMPTS),
    greedy and `samples` times sampled; returns it and the report (path not yet set). The held-out prompts'
    greedy answers measure the agreement."""
    if target.config.random_weights:
        raise InputError(f"--model {target.checkpoint.source}: random weights have nothing to distill; expected a "
                         "model file")
    if target.torch_dtype != torch.float32:
        raise InputError(f"--dtype {target.dtype}: a head trains on the target's float32 features; expected "
                         "--dtype float32")
    began = time.perf_counter()
    held_prompts = distill.PROMPTS[-distill.HELD_OUT:]
    prompts = (*distill.PROMPTS[:-distill.HELD_OUT], *EXTRA_PROMPTS) if prompts is None else prompts
    params = [SamplingParams()] + [SamplingParams(temperature=SAMPLE_TEMPERATURE, seed=seed) for seed in range(samples)]
    answers = distill.training_sequences  # (the module's: tests share one set of the target's answers)
    train = [_example(target, sequence) for sequence in answers(target, continuation, progress, prompts, params)]
    held_out = [_example(target, sequence) for sequence in answers(target, continuation, progress, held_prompts)]
    head = EagleHead(target.model, target.device)
    for parameter in target.model.parameters():
        parameter.requires_grad_(False)
    before = agreement(head, held_out)
    optimizer = torch.optim.AdamW(head.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(0)).tolist()
    losses = []
    for step in range(steps):
        example = train[order[step % len(train)]]
        with torch.enable_grad():
            predicted = _predict(head, example, NOISE)
            wanted = example.targets[example.first:]
            with torch.no_grad():
                teacher = F.log_softmax(head.logits(wanted), dim=-1)
            kl = F.kl_div(F.log_softmax(head.logits(predicted), dim=-1), teacher, log_target=True,
                          reduction="batchmean")
            scale = wanted.pow(2).mean().sqrt()
            loss = kl + FEATURE_LOSS * F.smooth_l1_loss(predicted / scale, wanted / scale)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
        losses.append(float(kl.detach()))
        if (step + 1) % max(steps // 10, 1) == 0 or step + 1 == steps:
            progress(f"step {step + 1}/{steps}: KL {losses[-1]:.3f} nats per position")
    head.eval()
    for parameter in head.parameters():
        parameter.requires_grad_(False)
    tenth = max(steps // 10, 1)
    report = HeadReport(steps, len(train), sum(losses[:tenth]) / tenth, sum(losses[-tenth:]) / tenth, before,
                        agreement(head, held_out), time.perf_counter() - began, "")
    return head, report
