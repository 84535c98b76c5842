"""Triage's probes on MLX: the profile splits host from device time per op class, the census finds every host
wait with its call site, the gate rules read from MLX's source answer for Metal and CUDA while MLX answers for the
device at hand, the M-sweep names each row count's kernel family, and the ceilings are measured and cached."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

mx = pytest.importorskip("mlx.core")

from conftest import tiny_checkpoint  # noqa: E402
from mlx_helpers import mlx_runner, quantized_checkpoint  # noqa: E402
from kerneltriage.backends.mlx import kernel_rules  # noqa: E402
from kerneltriage.backends.mlx.backend import BACKEND  # noqa: E402
from kerneltriage.engine.probes import SdpaCall  # noqa: E402

PREFIX, PROMPT = list(range(5, 20)), list(range(20, 40))


def test_profile_splits_op_classes_and_records_attention_calls() -> None:
    runner = mlx_runner(tiny_checkpoint("qwen3"))
    prefill = BACKEND.profile(runner, "prefill", [], PROMPT)
    assert {"q_proj", "attention", "norms", "output projection", "kv cache", "other"} <= set(prefill.class_seconds)
    assert prefill.output_rows == (len(PROMPT),)  # every prompt position's logits: last_logits would delete them
    assert prefill.busy_seconds == pytest.approx(sum(prefill.class_seconds.values()))
    (call,) = {c.signature(): c for c in prefill.attention_calls}.values()
    assert call.q == (1, 4, 20, 32) and call.is_causal and call.enable_gqa and call.mask is None
    decode = BACKEND.profile(mlx_runner(tiny_checkpoint("qwen3"), "last_logits"), "decode", PREFIX, 4)
    assert (decode.passes, decode.tokens) == (4, 4) and "sampling" in decode.class_seconds
    assert {c.q[-2] for c in decode.attention_calls} == {1}  # one query per decode step
    assert BACKEND.host_issue_seconds(runner, PREFIX, 4) > 0


def test_profile_of_a_compiled_decode_is_one_class() -> None:
    decode = BACKEND.profile(mlx_runner(tiny_checkpoint(), "compile=default"), "decode", PREFIX, 3)
    assert "compiled step" in decode.class_seconds and "q_proj" not in decode.class_seconds


@pytest.mark.parametrize("levers", ["", "one_sync"])
def test_census_counts_one_host_wait_per_token_with_its_call_site(levers: str) -> None:
    census = BACKEND.census(mlx_runner(tiny_checkpoint(), levers), "decode", PREFIX, 4)
    assert census["readbacks"] == 1.0
    (site,) = census["readback_sites"]
    assert site.startswith(".item() @ kerneltriage/backends/mlx/runner.py")
    # the sampler schedules each token as it is made (not a wait), the step's graph with it: one evaluation a token,
    # never a second for the step (its host pass and commit) nor a third for the read (pipelined, the 4 counted
    # tokens take 3 steps inside the count)
    assert 0.75 <= census["scheduled"] <= 1.0


def test_census_catches_a_planted_sync() -> None:
    runner = mlx_runner(tiny_checkpoint())
    step = runner.decode_step

    def syncing(model, tokens, start):  # noqa: ANN001, ANN202 - a step that reads a value back mid-step
        logits = step(model, tokens, start)
        logits.tolist()
        return logits

    runner.decode_step = syncing
    census = BACKEND.census(runner, "decode", PREFIX, 4)
    assert census["readbacks"] == 2.0 and any(site.startswith(".tolist() @ ") and "in syncing" in site
                                              for site in census["readback_sites"])


def test_gates_on_the_cpu_ask_mlx_and_name_metal_and_cuda_kernels() -> None:
    call = SdpaCall((1, 9, 1, 64), (1, 3, 300, 64), "float32", None, False, True)  # the default model's decode
    row = BACKEND.attention_gates("decode", call, 30.0, "cpu")
    assert row.default == "unfused (cpu)" and not row.usable["fused here (cpu)"]
    assert "no fused kernel is available in CPU backend" in row.reasons["fused here (cpu)"][0]
    assert row.usable["fused on metal"] and row.reasons["fused on metal"][0].startswith("sdpa_vector")
    assert row.seconds["default"] > 0 and set(row.seconds) == {"default"}


@pytest.mark.parametrize(("q_len", "keys", "dim", "gqa", "mask", "causal", "metal", "cuda"), [
    (1, 100, 64, 3, False, False, "sdpa_vector", "sdpa_vector"),  # cuDNN decodes from 256 keys on
    (1, 300, 128, 4, False, False, "sdpa_vector", "cudnn"),
    (1, 5000, 128, 4, False, False, "sdpa_vector_2pass", "cudnn"),
    (512, 512, 64, 3, False, True, "sdpa_full", "cudnn"),
    (512, 512, 80, 3, False, True, "sdpa_full", "cudnn"),
    (512, 512, 256, 1, False, True, "unfused", "unfused"),
    (1, 300, 320, 4, False, False, "unfused", "unfused"),
    (5, 300, 64, 8, True, False, "unfused", "cudnn"),  # Metal's vector kernel: 5 queries × GQA 8 > 32
    (1, 300, 64, 8, True, False, "sdpa_vector", "unfused"),  # CUDA: a masked decode row has neither kernel
])
def test_source_rules(q_len: int, keys: int, dim: int, gqa: int, mask: bool, causal: bool, metal: str,
                      cuda: str) -> None:
    assert kernel_rules.metal_sdpa(q_len, keys, dim, gqa, mask, causal)[0] == metal
    assert kernel_rules.cuda_sdpa(q_len, keys, dim, mask, causal, "bfloat16")[0] == cuda


def test_quantized_matmul_families_by_row_count() -> None:
    families = [kernel_rules.metal_qmm(m, 1024, 1536, 4, "applegpu_g15s") for m in (1, 2, 12, 13, 16)]
    assert families == ["qmv_fast", "qmv_wide", "qmv_wide", "qmm_splitk", "qmm_splitk"]
    # the default model's 576-wide rows miss qmv_fast (K a multiple of 512 at 4 bits); older GPUs have no qmv_wide
    chosen = [kernel_rules.metal_qmm(m, 576, 1536, 4, "applegpu_g13g") for m in (1, 2, 14)]
    assert chosen == ["qmv", "qmv", "qmm_splitk"]
    assert [kernel_rules.cuda_qmm(m, 576, n, "bfloat16") for m, n in ((7, 1536), (8, 1536), (8, 576))] == \
        ["qmv", "qmm_sm80", "qmm_naive"]
    assert kernel_rules.cpu_qmm(4, accelerate=False) == "qmm_t"


def test_sweep_times_every_projection_and_names_its_families() -> None:
    runner = mlx_runner(quantized_checkpoint("llama"), "quantized")
    curves = BACKEND.sweep_projections(runner, (1, 2, 4))
    names = {name for curve in curves for name in curve.name.split("/")}
    assert {"q_proj", "gate_proj", "down_proj", "lm_head"} <= names and "embed_tokens" not in names
    curve = next(c for c in curves if "gate_proj" in c.name)
    assert (curve.k, curve.n, curve.rows) == (64, 96, (1, 2, 4)) and all(s > 0 for s in curve.seconds)
    assert curve.kernels["cpu"] == ("qmm_t",) * 3 and len(curve.kernels["cuda sm80/sm90"]) == 3
    assert runner.counters["quantized"] == 0  # the sweep is not the model running


def test_sparsity_and_seam_errors() -> None:
    runner = mlx_runner(tiny_checkpoint())
    sparsity = BACKEND.attention_sparsity(runner)
    assert 0 < sparsity.fraction < 1 and len(sparsity.per_layer) == 2
    levered = mlx_runner(quantized_checkpoint(), "quantized,packed_qkv")
    errors = BACKEND.seam_errors(levered)
    assert {"qkv", "o_proj", "gate_up", "down", "lm_head"} <= set(errors)
    assert all(error <= 1e-5 for error, _ in errors.values())


def test_ceilings_are_measured_on_mlx_and_cached_under_an_mlx_key(tmp_path: Path) -> None:
    from kerneltriage.backends.mlx import ceilings

    path = tmp_path / "ceilings.json"
    first = ceilings.get_ceilings("cpu", "float32", path=path)
    assert first.source == "measured" and first.bandwidth > 1e8 and first.matmul_flops > 1e8
    (key,) = json.loads(path.read_text())
    assert f"mlx {mx.__version__} cpu" in key and ceilings.get_ceilings("cpu", "float32", path=path) == first
    assert "copy numpy" in key  # the CPU's memory rate, not MLX's elementwise pass (10× below it on a 2-core EPYC)


def test_under_a_constraint_the_step_is_queued_before_the_host_waits_for_the_last_token() -> None:
    """A decode step stays lazy for its token's evaluation, except where the sampler must wait on the host for the
    last token first (a constraint's `follow`): there the loop queues the step before it waits."""
    from kerneltriage.engine.decoding import next_logits

    runner, events = mlx_runner(tiny_checkpoint()), []
    scheduled = runner.queue
    runner.queue = lambda logits: (events.append("queue"), scheduled(logits))[1]  # type: ignore[method-assign]

    class Read:
        def result(self) -> int:
            events.append("read")
            return 5

    class Constrained:  # what the loops ask of a sampler with host state
        host_bound = True

        def follow(self, token: int) -> None:
            events.append("follow")

    runner.reset_cache(len(PREFIX) + 2)
    mx.eval(runner.prefill(PREFIX, 0))
    next_logits(runner, Constrained(), mx.array([5]), Read(), len(PREFIX))
    assert events == ["queue", "read", "follow"]
    events.clear()

    class Free(Constrained):
        host_bound = False

    next_logits(runner, Free(), mx.array([5]), Read(), len(PREFIX) + 1)
    assert events == []  # the sampler queues it with its token
