"""Online serving benchmark: Quire's stack beside `vllm serve` and `transformers serve`.

    python -m benchmarks.serving [--model DIR] [--dataset sharegpt|random]
        [--peers vllm,transformers] [--burst N] [--no-vllm-client]
        [--rates 0.25,0.5,0.75,1,1.5] [--num-prompts N]
        [--input-len MEAN] [--output-len MEAN] [--shared-prefix-len N] [--num-shared-prefixes K]
        [--slo-ttft-ms MS] [--slo-tpot-ms MS] [--num-executors N] [--skip-baseline]
        [--skip-quire] [--seed S] [--out DIR] [--rescore SERVING_JSON] [--quick]

Each server is started here on free ports in turn, with the whole machine to itself, and
stopped afterwards: Quire's stack (services.stack.runner.Stack: Redis, memory manager,
--num-executors executors sharing the cores evenly, router), vLLM's OpenAI server from the
peer venv (benchmarks.peers.vllm_server) and `transformers serve` with continuous batching (via
benchmarks.serving_hf, which lets it load on the CPU without `accelerate`), all serving the same
local checkpoint (default SmolLM2-135M-Instruct); the peers run with HF_HUB_OFFLINE=1.

Load. The requests are real ShareGPT requests sampled by vLLM's rule (--dataset sharegpt, the
default; vLLM's own sampler must draw the same ones, `sampling_check`) or random token ids of
lognormal lengths (--dataset random, means --input-len / --output-len; --shared-prefix-len N
puts one of --num-shared-prefixes K seeded prefixes, tenants' system prompts, in front of
every prompt). One seeded sample is split into disjoint sets, so no prefix cache answers one
phase from another: the warmup, the burst (--burst requests sent at once), and a fresh set of
--num-prompts per rate of --rates, sent at Poisson arrival times (exponential gaps with mean
1/rate, seeded). Between the burst and the rates, on ShareGPT, vLLM's own client (`vllm bench
serve`, benchmarks.online.vllm_client) drives Quire and vLLM too. Every system is asked for exactly
each request's output length: Quire and vLLM with `ignore_eos`, transformers with a
`generation_config` that sets min_new_tokens (and, being a fresh config, no EOS).

Per request (benchmarks.common.sse): TTFT (send to first text chunk), ITL (every gap between
text chunks), e2e, output tokens from the stream's usage, TPOT = (e2e - TTFT) /
(output_tokens - 1). Per rate, as `vllm bench serve` reports them: request and output-token
throughput, mean/median/p99 of TTFT, TPOT, ITL and e2e, and goodput (requests/s meeting both
SLOs). Each rate's SLO load is max(TTFT p99 / TTFT SLO, TPOT p99 / TPOT SLO), and the
sustainable rate is where it crosses 1.0: a scheduler that admits everything keeps TTFT low
past capacity while TPOT explodes, so TTFT alone would call it sustainable (see DEFINITIONS).
Writes <out>/serving.json and <out>/serving.png; docs/benchmarks.md has the latest figures and
the commands that measured them.

The client shares the machine with the servers, so a busy neighbour shows up as queueing: the
JSON records the load average before and after the run; compare runs only at similar load.
"""
