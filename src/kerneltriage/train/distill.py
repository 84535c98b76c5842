"""A draft model trained by self-distillation (issue 14's trained drafter): a copy of the target's first L layers,
with its embedding, final norm and output projection, trained to match the target's own next-token distribution
(KL(target ‖ draft) at every position of the answers) on the target's greedy continuations of a set of prompts —
the text a draft is asked to continue; not the prompts, whose chat-template boilerplate it would learn instead —
then written as a Hugging Face folder (config.json, model.safetensors, the target's tokenizer) that
`--spec draft:PATH` loads.

Only the copied layers and the final norm train; the embedding and output projection stay the target's (the draft
must score the same vocabulary). Before training the draft is `--spec selfdraft:L`; the report gives the top-1
agreement with the target over held-out answers — what a verify accepts at draft position 1 — before and after.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

import torch
import torch.nn.functional as F

from kerneltriage.backends.torch.backend import build_runner
from kerneltriage.backends.torch.cache import KVCache
from kerneltriage.backends.torch.models import Model
from kerneltriage.backends.torch.runner import Runner
from kerneltriage.core.errors import InputError
from kerneltriage.engine import names
from kerneltriage.engine.names import param_name
from kerneltriage.engine.checkpoint import Checkpoint
from kerneltriage.engine.generation import generate_step
from kerneltriage.engine.sampling import SamplingParams

# Training prompts: generic requests of the kinds a chat model answers, none taken from benchmarks/prompts/ (the
# evaluation sets stay unseen). The target's greedy answers to them are the training text.
PROMPTS = (
    "Explain how a hash table handles collisions.",
    "Write a Python function that reverses the words in a sentence.",
    "List five common uses of the Linux command grep.",
    "Convert this JSON to YAML: {\"name\": \"Ada\", \"tags\": [\"math\", \"engines\"], \"active\": true}",
    "Summarize the water cycle in three sentences.",
    "Write a SQL query that counts orders per customer in a table orders(customer_id, total).",
    "What is the difference between a process and a thread?",
    "Give a short recipe for pancakes.",
    "Rewrite this sentence in the passive voice: The committee approved the new budget.",
    "Write a bash loop that renames every .txt file in a folder to .md.",
    "Describe the rules of tic-tac-toe.",
    "Translate to French: Good morning, how are you today?",
    "Write a JavaScript function that debounces another function.",
    "Explain what a binary search does, step by step.",
    "Write a haiku about autumn rain.",
    "List the planets of the solar system in order from the sun.",
    "Write a C function that computes the length of a string without strlen.",
    "What are the main causes of inflation?",
    "Format these names as a Markdown table with columns first and last: Ada Lovelace, Alan Turing, Grace Hopper.",
    "Explain recursion to a ten-year-old.",
    "Write a Rust function that sums a vector of integers.",
    "Give three tips for writing clear emails.",
    "Write a regular expression that matches an ISO date like 2024-05-17.",
    "Describe how photosynthesis works.",
)
HELD_OUT = 4  # the last prompts: agreement is measured on them, never trained on
LEARNING_RATE = 3e-4
Progress = Callable[[str], None]


@dataclass
class DistillReport:
    layers: int
    steps: int
    sequences: int  # training sequences (prompt + the target's continuation)
    kl_first: float  # mean KL over the first tenth of the steps (nats per answer position)
    kl_last: float  # … over the last tenth
    agreement_before: float  # top-1 agreement with the target over the held-out answers, before training
    agreement_after: float
    seconds: float
    path: str

    def to_dict(self) -> dict:
        return asdict(self)


def student_checkpoint(target: Checkpoint, layers: int) -> Checkpoint:
    """The target's checkpoint cut to its first `layers` layers (the tensors are the target's own, not copies)."""
    total = target.config.num_layers
    if not 1 <= layers < total:
        raise InputError(f"--layers {layers}: expected 1..{total - 1} (fewer than the target's {total} layers)")
    if target.config.random_weights:
        raise InputError(f"--model {target.source}: random weights have nothing to distill; expected a model file")
    if target.tokenizer.is_synthetic:
        raise InputError(f"--model {target.source}: its tokenizer cannot be written to a draft folder")
    if "rope_freqs" in target.tensors and target.config.rope_scaling is None:
        raise InputError(f"--model {target.source}: its rope_freqs factors have no config.json spelling; expected "
                         "a model without them (or a Hugging Face folder)")
    kept = {name: raw for name, raw in target.tensors.items()
            if not name.startswith("layers.") or int(name.split(".")[1]) < layers}
    return Checkpoint(target.config.replace(num_layers=layers), kept, target.tokenizer,
                      source=f"{target.source} (first {layers} layers)", chat_template=target.chat_template)


class Answered(NamedTuple):
    """A prompt followed by the target's greedy continuation; `start` is the first continuation token's index."""

    tokens: list[int]
    start: int


def training_sequences(target: Runner, continuation: int, progress: Progress, prompts: Sequence[str] | None = None,
                       params: Sequence[SamplingParams] = (SamplingParams(),)) -> list[Answered]:
    """Each prompt (`PROMPTS` by default; in the chat template with the assistant's turn opened, as `generate --chat`
    and the prompt sets run it, where the model has one) followed by the target's continuation under each of
    `params` (greedy by default), and where the answer starts: prompt by prompt, `params` in order."""
    tokenizer, sequences = target.checkpoint.tokenizer, []
    prompts = PROMPTS if prompts is None else prompts
    for index, text in enumerate(prompts):
        if tokenizer.chat_template:
            text = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        prompt = tokenizer.encode(text, add_special=not tokenizer.chat_template)
        for sampling in params:
            sequences.append(Answered(prompt + list(generate_step(target, prompt, sampling, continuation)),
                                       len(prompt)))
        progress(f"target's continuations: {index + 1}/{len(prompts)}")
    return sequences


class Unstored(KVCache):
    """One forward over a whole sequence from position 0: attention reads that forward's own keys and values and
    nothing is stored (autograd cannot pass through writes into one buffer that every layer shares)."""

    def __init__(self, length: int, device: torch.device) -> None:  # noqa: D107 - no buffers to allocate
        self.keys, self.max_len, self.length = torch.empty(0, device=device), length, 0

    def update(self, layer: int, pos, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
        return k, v


def _logits(model: Model, tokens: list[int], device: torch.device) -> torch.Tensor:
    """(T, V) float32 logits of one forward over `tokens`, nothing cached (gradients flow where enabled)."""
    model.cache = Unstored(len(tokens), device)
    try:
        return model(torch.tensor([tokens], device=device), 0)[0].float()
    finally:
        model.cache = None


def _answer(logits: torch.Tensor, sequence: Answered) -> torch.Tensor:
    """The rows that predict the continuation's tokens: what a draft is asked for (the prompt's rows — a chat
    template's fixed system text among them — would flatter it)."""
    return logits[sequence.start - 1:-1]


def agreement(target: Runner, student: Runner, sequences: Sequence[Answered]) -> float:
    """The fraction of continuation positions where the draft's top token is the target's (draft position 1's
    acceptance)."""
    hits = total = 0
    with torch.no_grad():
        for sequence in sequences:
            teacher = _answer(_logits(target.model, sequence.tokens, target.device), sequence).argmax(-1)
            draft = _answer(_logits(student.model, sequence.tokens, student.device), sequence).argmax(-1)
            hits += int((draft == teacher).sum())
            total += len(teacher)
    return hits / total


def distill(target: Runner, layers: int, steps: int, continuation: int, progress: Progress = lambda line: None
            ) -> tuple[Runner, DistillReport]:
    """Train a draft of `layers` layers for `steps` steps on the target's `continuation`-token greedy answers
    (float32, on the target's device); returns its runner and the report (path not yet set)."""
    began = time.perf_counter()
    student = build_runner(student_checkpoint(target.checkpoint, layers), target.device, torch.float32)
    sequences = training_sequences(target, continuation, progress)
    train, held_out = sequences[:-HELD_OUT], sequences[-HELD_OUT:]
    before = agreement(target, student, held_out)
    trained = [p for name, p in student.model.named_parameters() if name.startswith(("layers.", "norm."))]
    for parameter in trained:
        parameter.requires_grad_(True)
    optimizer = torch.optim.AdamW(trained, lr=LEARNING_RATE, weight_decay=0.0)
    with torch.no_grad():  # the target's distributions, once per sequence (each is trained on steps/len times)
        teachers = [F.log_softmax(_answer(_logits(target.model, sequence.tokens, target.device), sequence), dim=-1)
                    for sequence in train]
    losses = []
    for step in range(steps):
        sequence, teacher = train[step % len(train)], teachers[step % len(train)]
        with torch.enable_grad():
            logits = _answer(_logits(student.model, sequence.tokens, student.device), sequence)
            draft = F.log_softmax(logits, dim=-1)
            loss = F.kl_div(draft, teacher, log_target=True, reduction="batchmean")  # KL(target ‖ draft) per position
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        losses.append(float(loss.detach()))
        if (step + 1) % max(steps // 10, 1) == 0 or step + 1 == steps:
            progress(f"step {step + 1}/{steps}: KL {losses[-1]:.3f} nats per position")
    for parameter in trained:
        parameter.requires_grad_(False)
    tenth = max(steps // 10, 1)
    report = DistillReport(layers, steps, len(train), sum(losses[:tenth]) / tenth, sum(losses[-tenth:]) / tenth,
                           before, agreement(target, student, held_out), time.perf_counter() - began, "")
    return student, report


def save_folder(student: Runner, folder: Path) -> None:
    """The draft as a Hugging Face folder: config.json, model.safetensors (bf16), tokenizer.json and its config."""
    from safetensors.torch import save_file

    checkpoint, config = student.checkpoint, student.checkpoint.config
    hf = config.to_hf() | {"torch_dtype": "bfloat16"}
    weights = {names.from_internal(internal, names.HF, config.arch): student.model.get_parameter(
                   param_name(internal, config.arch)).detach().to("cpu", torch.bfloat16).contiguous()
               for internal in checkpoint.tensors if param_name(internal, config.arch) is not None}
    tokenizer = checkpoint.tokenizer
    special = {"bos_token": tokenizer.token_text(tokenizer.bos_token_id) or None,  # the post-processor is the
               "chat_template": tokenizer.chat_template}  # target's own, in tokenizer.json: no add_bos_token
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / "model.safetensors.partial"
    save_file(weights, str(partial))
    (folder / "config.json").write_text(json.dumps(hf, indent=1))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": list(tokenizer.eos_token_ids)}))
    (folder / "tokenizer.json").write_text(tokenizer.to_json())
    (folder / "tokenizer_config.json").write_text(json.dumps(special, indent=1))
    partial.replace(folder / "model.safetensors")  # last: a folder without it is not a model
