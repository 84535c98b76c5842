"""Question 1 — can I delete work? Detectors over measured shares and recorded calls; each returns a
Finding or None (silent). Estimates are Amdahl bounds on the measured shares; a measured gain is
attached where a lever exists and was A/B'd.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

from kerneltriage.triage.amdahl import speedup, speedup_if_free
from kerneltriage.triage.finding import Finding
from kerneltriage.triage.measure import LeverResult

if TYPE_CHECKING:
    from kerneltriage.engine.probes import SdpaCall, Sparsity

QUESTION = "delete"
OUTPUT_CLASS, ATTENTION_CLASS = "output projection", "attention"
CAUSAL_SKIP_FACTOR = 2.0  # a causal kernel skips the tiles above the diagonal: about half the work
OUTPUT_SHARE_MIN = 0.05  # the output projection's decode share worth a vocabulary-compaction note
SPARSE_FRACTION_MIN = 0.5  # attention weights below the threshold worth a sparse-V note
V_SHARE_OF_ATTENTION = 0.5  # sparse-V skips V rows only: at most the V half of the K+V bytes attention reads
_MAX_SHARE = 0.999  # an all-padding prompt: the bound stays finite


def _measured(result: LeverResult | None, phase: str) -> tuple[float | None, str]:
    """A lever's measured B/A in `phase` as a finding's measured gain (only when the A/B is valid), and the
    confidence."""
    ratio = None if result is None else result.ratio(phase)
    return (None, "estimated") if ratio is None else (ratio, "measured")


def all_position_logits(output_rows: Sequence[int], output_share: float, gain: LeverResult | None = None
                        ) -> Finding | None:
    """The prefill's output projection ran for more rows than the one position whose logits are read."""
    rows = max(output_rows, default=1)
    if rows <= 1:
        return None
    deletable = output_share * (1 - 1 / rows)
    measured, confidence = _measured(gain, "prefill")
    return Finding(
        QUESTION, "all-position-logits",
        f"prefill computes logits for all {rows} prompt positions; only the last is read",
        {"rows": rows, "output_share": output_share, "deletable_share": deletable,
         "ab": None if gain is None else gain.to_dict()},
        speedup_if_free(deletable), measured, confidence,
        "apply the output projection to the last position only (--levers last_logits)", "prefill", "last_logits")


def explicit_causal_masks(calls: Sequence[SdpaCall], attention_share: float) -> Finding | None:
    """Attention on a fresh prompt given an explicit mask (that is causal, or of unknown content) instead
    of is_causal: the kernel computes every tile, those above the diagonal included."""
    masked = [c for c in calls if c.fresh_prompt and c.mask is not None and not c.is_causal
              and c.mask_is_causal is not False]
    if not masked:
        return None
    return Finding(
        QUESTION, "explicit-causal-mask",
        f"{len(masked)} attention calls on a fresh prompt pass an explicit mask where is_causal would do",
        {"calls": len(masked), "mask_shape": list(masked[0].mask or ()), "attention_share": attention_share,
         "mask_is_causal": [c.mask_is_causal for c in masked[:1]]},
        speedup(attention_share, CAUSAL_SKIP_FACTOR), None, "estimated",
        "call scaled_dot_product_attention with is_causal=True and no mask on a fresh prompt", "prefill")


def padding_work(tokens: Sequence[int], pad_id: int | None) -> Finding | None:
    """Leading or trailing runs of the pad token: prefill work on positions that carry nothing."""
    if pad_id is None or not tokens:
        return None
    lead = next((i for i, t in enumerate(tokens) if t != pad_id), len(tokens))
    trail = next((i for i, t in enumerate(reversed(tokens)) if t != pad_id), len(tokens))
    pads = min(len(tokens), lead + trail)
    if pads == 0:
        return None
    share = pads / len(tokens)  # prefill work grows at least linearly with the positions computed
    return Finding(
        QUESTION, "padding-work", f"{pads} of {len(tokens)} prompt positions are padding (pad id {pad_id})",
        {"pad_tokens": pads, "leading": min(lead, len(tokens)), "trailing": pads - min(lead, len(tokens)),
         "prompt_tokens": len(tokens)},
        speedup_if_free(min(share, _MAX_SHARE)), None, "estimated",
        "strip padding before prefill (batch by length or use a packed/varlen layout)", "prefill")



def output_projection_decode(output_share: float, constrained: bool = False) -> Finding | None:
    """The output projection's share of a decode step: the ceiling for vocabulary compaction, a lever only where the
    workload is constrained (its allowed set is what it computes)."""
    if output_share < OUTPUT_SHARE_MIN:
        return None
    fix = ("score only the allowed tokens' rows of the output projection (--levers vocab_compact)" if constrained
           else "under constrained decoding (--choices, --regex, --json-schema), score only the allowed tokens "
                "(--levers vocab_compact)")
    return Finding(
        QUESTION, "vocabulary-ceiling",
        f"the output projection is {output_share:.0%} of each decode step",
        {"output_share": output_share, "constrained": constrained},
        speedup_if_free(output_share), None, "ceiling", fix, "decode", "vocab_compact" if constrained else None)


def blocks_read_as_values(block_bytes: int, value_bytes: int, read_bytes: int) -> Finding | None:
    """torch on the CPU, not in bf16: the file stores the projections (and head) as Q4_0/Q4_1/Q8_0 blocks of
    `block_bytes` that decode reads as `value_bytes` of dequantized values, of `read_bytes` of weights a token. The
    `quantized` lever reads the blocks there only for bf16 activations (torch's int4 CPU kernel is scalar code in
    the other dtypes), so the climb cannot find it from this run: the fix changes the dtype too."""
    if block_bytes <= 0 or value_bytes <= block_bytes or read_bytes < value_bytes:
        return None
    return Finding(
        QUESTION, "blocks-read-as-values",
        f"decode reads {value_bytes / 1e6:,.0f} MB of dequantized weights a token where the file holds them as "
        f"{block_bytes / 1e6:,.0f} MB of Q4/Q8 blocks",
        {"block_bytes": block_bytes, "value_bytes": value_bytes, "read_bytes": read_bytes},
        read_bytes / (read_bytes - value_bytes + block_bytes), None, "estimated",
        "run in bf16 with the blocks read as they are: --dtype bfloat16 --levers quantized,packed_qkv,packed_gate_up "
        "(torch's int4 CPU matmul takes bf16 activations only; bf16 is judged by ab's logit tolerance)", "decode",
        "quantized")


def sparse_v_share(sparsity: Sparsity, attention_share: float) -> float:
    """The share of a decode step sparse-V can delete: the V half of what attention reads, times the V rows every query
    head of their KV head weighs below the threshold (the weights below it, where that was not measured)."""
    skippable = sparsity.fraction if sparsity.skippable is None else sparsity.skippable
    return attention_share * V_SHARE_OF_ATTENTION * skippable


def sparse_v(sparsity: Sparsity | None, attention_share: float) -> Finding | None:
    """Real weights only: the V rows nobody attends to bound what skipping them saves."""
    if sparsity is None:
        return None
    skippable = sparsity.fraction if sparsity.skippable is None else sparsity.skippable
    if skippable < SPARSE_FRACTION_MIN:
        return None
    deletable = sparse_v_share(sparsity, attention_share)
    return Finding(
        QUESTION, "sparse-v",
        f"{skippable:.0%} of V rows get weights below {sparsity.threshold:g} from every query head that reads them, "
        f"at depth {sparsity.depth}",
        sparsity.to_dict() | {"attention_share": attention_share, "deletable_share": deletable},
        speedup_if_free(deletable), None, "estimated",
        "skip those V rows (--levers sparse_v, declared approximate: judged by its quality metrics; under graphs "
        "--levers kernel=kerneltriage.kernels.sparse_v_attention:SPARSE_V)", "decode", "sparse_v")


def sparse_v_note(sparsity: Sparsity, attention_share: float) -> str:
    """Q1's line on sparse-V whether or not it is worth a finding: what was measured and the ceiling it gives."""
    skippable = sparsity.fraction if sparsity.skippable is None else sparsity.skippable
    ceiling = speedup_if_free(sparse_v_share(sparsity, attention_share))
    return (f"sparse-V: {sparsity.fraction:.0%} of attention weights, {skippable:.0%} of V rows (every query head of "
            f"their KV head) below {sparsity.threshold:g} at depth {sparsity.depth} on the passage; attention "
            f"{attention_share:.0%} of decode: ceiling {ceiling:.3f}× (lever sparse_v)")


def deletable(sparsity: Sparsity | None) -> dict[str, float]:
    """lever → the fraction of its seams' share Q1 measured it can delete (the climb scales its ceiling by it):
    sparse-V's is unknown without real weights, and taken as 0 (a random model's uniform attention skips nothing)."""
    return {"sparse_v": 0.0 if sparsity is None else sparse_v_share(sparsity, 1.0)}


def analyze(prefill_shares: Mapping[str, float], decode_shares: Mapping[str, float], output_rows: Sequence[int],
            prefill_calls: Sequence[SdpaCall], prompt: Sequence[int], pad_id: int | None,
            sparsity: Sparsity | None, last_logits: LeverResult | None, constrained: bool = False) -> list[Finding]:
    """Every Q1 detector that fires."""
    found = (
        all_position_logits(output_rows, prefill_shares.get(OUTPUT_CLASS, 0.0), last_logits),
        explicit_causal_masks(prefill_calls, prefill_shares.get(ATTENTION_CLASS, 0.0)),
        padding_work(prompt, pad_id),
        output_projection_decode(decode_shares.get(OUTPUT_CLASS, 0.0), constrained),
        sparse_v(sparsity, decode_shares.get(ATTENTION_CLASS, 0.0)),
    )
    return [f for f in found if f is not None]
