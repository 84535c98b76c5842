"""The text the attention-sparsity probes of every backend read: one passage, one place."""

# A real passage (not random tokens: attention on noise is not what a model does on text).
PASSAGE = (
    "Before you write a custom GPU kernel, ask three questions in order and measure the answers. First, can "
    "you delete work? Logits for prompt positions nobody reads, tiles above the causal diagonal and value rows "
    "whose attention weight is almost zero all cost time and change nothing. Second, can you unlock an existing "
    "fast path? The software stack is full of dispatch gates: lists of supported head sizes, thresholds on "
    "sequence length, tables of tile sizes, and rules about masks, data types and alignment. Falling off one "
    "of them is silent, and the slow path that runs instead can cost ten times more. Third, can you cut the "
    "overhead of dispatch and synchronization? A small model can spend most of each decoding step launching "
    "kernels and waiting for the host, which graph capture, compilation or a single synchronization per step "
    "remove. Only when all three questions come up empty does a hand-written kernel have decent odds, because "
    "the stock libraries are good: the repeated public result is that replacements come back slower than the "
    "kernels they replace. The wins that survive usually sit above the kernel, in deleted work, an unlocked "
    "gate or fewer synchronizations. Measurement has its own discipline. Report prefill and decode apart, warm "
    "up before timing, keep the raw samples, compare configurations in interleaved pairs after sizing the noise "
    "of the baseline against itself, and check that the candidate code path actually ran."
)
