"""Online serving benchmark: Quire's stack beside `vllm serve`, llama.cpp's `llama-server` and
`transformers serve`, each in the same pinned dtype, along the latency-throughput curve.

    python -m benchmarks.serving [--model DIR] [--dataset sharegpt|random]
        [--peers vllm,llamacpp,transformers] [--dtypes float32,bfloat16,q4_1,q8_0]
        [--concurrency 1,4,16,all] [--curve-prompts 8,16,32,64] [--clients vllm,quire]
        [--rates 0.25,0.5,1] [--num-prompts N]
        [--input-len MEAN] [--output-len MEAN] [--shared-prefix-len N] [--num-shared-prefixes K]
        [--slo-ttft-ms MS] [--slo-tpot-ms MS] [--num-executors N] [--skip-baseline]
        [--skip-quire] [--seed S] [--out DIR] [--rescore SERVING_JSON] [--quick]

Systems and dtypes. Each server is started here on free ports in turn, with the whole machine
to itself, and stopped afterwards, once per dtype of --dtypes it serves, the dtype pinned on
its command line: Quire's stack (services.stack.runner.Stack: Redis, memory manager,
--num-executors executors sharing the cores evenly, router; the executors' --dtype), vLLM's
OpenAI server from the peer venv (benchmarks.peers.vllm_server, --dtype), llama.cpp's
llama-server (benchmarks.peers.llamacpp_server, `make peer-llamacpp`) on the GGUF of the same
weights in that dtype (F32, BF16; "q4_1" is the packaged 4-bit file and "q8_0" an 8-bit one,
which Quire serves as they are too: `--model file.gguf`, its default int8 activations)
and `transformers serve` with continuous batching (via benchmarks.serving_hf, --dtype). All
serve the same model (default SmolLM2-135M-Instruct); the peers run with HF_HUB_OFFLINE=1.
Every row of the JSON and the tables is one system in one dtype ("quire float32").

Load. The requests are real ShareGPT requests sampled by vLLM's rule (--dataset sharegpt, the
default; vLLM's own sampler must draw the same ones, `sampling_check`) or random token ids of
lognormal lengths (--dataset random, means --input-len / --output-len; --shared-prefix-len N
puts one of --num-shared-prefixes K seeded prefixes, tenants' system prompts, in front of
every prompt). One seeded sample is split into disjoint sets, so no prefix cache answers one
phase from another: a fresh set per curve point, the warmup, and a fresh set of --num-prompts
per Poisson rate of --rates. Every system is asked for exactly each request's output length:
Quire, vLLM and llama.cpp with `ignore_eos`, transformers with a `generation_config` that sets
min_new_tokens (and, being a fresh config, no EOS).

The curve (benchmarks.online.curve). At each --concurrency point c the point's requests go out
in order with at most c in flight ("all": at once), driven by vLLM's own client (`vllm bench
serve --max-concurrency c`, its custom dataset holding exactly these requests) and/or this
benchmark's (--clients). Per point: output and request throughput, TTFT, TPOT, ITL and e2e
mean / p50 / p99; per dtype and peer, same-run ratios point by point (output tok/s Quire /
peer, TTFT p50 and TPOT p50 peer / Quire: above 1, Quire is ahead).

Poisson rates (--rates, none by default). Per request (benchmarks.common.sse): TTFT (send to
first text chunk), ITL (every gap between text chunks), e2e, output tokens from the stream's
usage, TPOT = (e2e - TTFT) / (output_tokens - 1). Per rate, as `vllm bench serve` reports them:
request and output-token throughput, mean/median/p99 of TTFT, TPOT, ITL and e2e, and goodput
(requests/s meeting both SLOs). Each rate's SLO load is max(TTFT p99 / TTFT SLO, TPOT p99 /
TPOT SLO), and the sustainable rate is where it crosses 1.0: a scheduler that admits
everything keeps TTFT low past capacity while TPOT explodes, so TTFT alone would call it
sustainable (see DEFINITIONS).

Writes <out>/serving.json and <out>/serving.png (the curves, and the rates if run);
docs/benchmarks.md has the latest figures and the commands that measured them. The client
shares the machine with the servers, so a busy neighbour shows up as queueing: the JSON records
the load average before and after the run; compare runs only at similar load.
"""
