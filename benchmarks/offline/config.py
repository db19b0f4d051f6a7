"""The offline benchmark's settings: the engines' shared limits, --quick, and the figures' definitions."""

from __future__ import annotations

DEFAULT_MODEL = "models/smollm2-135m-instruct"
BLOCK_SIZE = 16  # KV block size (tokens), every paged system
MAX_NUM_SEQS = 256  # sequence budget of every continuous batcher
MAX_NUM_BATCHED_TOKENS = 2048  # tokens per step (prefill chunks + decodes), every engine
CONCURRENCY_BUDGET_CONTEXTS = 8  # fixed KV budget: this many 2048-token contexts' worth
CONCURRENCY_CONTEXT = 2048  # the budget's unit: ShareGPT requests are kept up to 2048 tokens
CONCURRENCY_DEMAND = 3.0  # concurrency run: total tokens requested / budget tokens
CONCURRENCY_MAX_NUM_SEQS = 4096  # large: only the KV budget should bound concurrency
# Window run (a model whose every layer slides): the KV budget blocks outside the window are
# freed or kept in; small enough that keeping them bounds how many sequences run.
WINDOW_BUDGET_BLOCKS = 256
# Static batch for generate(): on 2 cores a decode step costs about the same at 4, 8 and 16
# rows, so 16 is the fastest once the longer tail of a bigger batch is priced in.
HF_BATCH_SIZE = 16
MATMUL_SIZE = 2048  # square matmul that stands for the machine's peak FLOP/s in each dtype
# ... or a smaller one where one product of the next size would take longer than this
MATMUL_PROBE_S = 0.5
TIMELINE_POINTS = 300  # at most this many KV-utilization samples go into the JSON

# --quick: the smoke test's settings (a tiny model, a few short requests, a small budget).
QUICK = {
    "model": "models/quire-tiny",
    "num_requests": 4,
    "max_prompt_len": 48,
    "max_output_len": 24,
    "budget_contexts": 1,
    "num_kv_blocks": 512,  # Quire's pool (and transformers' in tokens): small, quick to zero
    "threads": 1,  # immune to a busy neighbour stalling a multi-thread team on tiny ops
}

DEFINITIONS = {
    "tok_s": "requested output tokens / wall seconds from the first request to the last token",
    "kv_utilization": "Quire: time-weighted mean over steps of sum(seq.num_tokens) / "
    "(num_blocks_used * block_size) over running sequences, sampled after the step's block "
    "allocation and before its forward pass (every running token has its slot then, but a "
    "sliding-window model's tokens in released blocks, left out here and counted by the "
    "contiguous figures); each step is weighted by its wall time",
    "contiguous_kv_utilization": "the same samples with each running sequence reserving "
    "prompt_len + max_tokens contiguous slots (exact-reservation, Orca-oracle style)",
    "contiguous_kv_utilization_full_context": "the same with each running sequence reserving "
    "the model's full context (FasterTransformer / Orca-max style)",
    "concurrency_ratio": "fixed KV budget (budget_blocks). Quire: time-average number of "
    "running sequences over the saturated window, i.e. from the first step where the block "
    "pool refused an admission or preempted to the last step with a non-empty waiting queue "
    "(the paper's 'average number of batched requests'); peak running is reported too. "
    "Contiguous: floor(budget_tokens / max(prompt_len + output_len) over the requests). "
    "Ratio = Quire mean / contiguous count. The run drives the real engine (scheduler, block "
    "manager, sampler) with the model's forward replaced by constant logits: with forced "
    "output lengths and random prompts, which blocks are held depends only on token counts",
    "concurrency_ratio_peak": "peak running sequences / contiguous count",
    "concurrency_ratio_vs_oracle": "Quire mean / the mean running sequences of a simulated "
    "contiguous batcher that reserves exactly prompt_len + output_len per request (Orca "
    "oracle; an upper bound: no fragmentation, no prefill budget), over its saturated steps",
    "stub_tok_s": "concurrency run's tokens/s with the forward stubbed: what the engine's "
    "Python (scheduler, allocator, sampler, detokenizer) alone can sustain at that batch size",
    "concurrency_ratio_full_context": "Quire mean / floor(budget_tokens / context)",
    "tokens_identical_to_vllm": "requests whose greedy output token ids equal vLLM's exactly, "
    "in the same dtype, out of all requests",
    "peak_rss_mib": "peak resident memory of each system's processes: Quire's from this "
    "process's VmHWM over one dtype's runs (reset before its LLM loads; the process's "
    "libraries and whatever earlier runs left resident count too), vLLM's summed over its "
    "front-end and engine-core processes",
    "matmul_fraction": "Quire achieved FLOP/s / best matmul FLOP/s in the same dtype measured in this "
    "run (torch's square matmul of matmul_size: smaller than 2048 where that dtype's GEMM is slow "
    "on this CPU, e.g. bfloat16 without AVX512_BF16, where Quire computes widened and the "
    "fraction exceeds 1). Achieved = (2 * decoder linear params * tokens computed (prefill + decode) + 2 * "
    "lm_head params * logit rows + 4 * layers * heads * head_dim * sum of context lengths "
    "over computed tokens) / Quire wall time; embedding lookups and norms are not counted",
}

DTYPES = ("float32", "bfloat16")
