"""Online serving benchmark: Quire's stack beside `transformers serve` under Poisson load.

    python -m benchmarks.serving [--model DIR] [--rates 0.5,1,1.5,2,3,4] [--num-prompts N]
        [--input-len MEAN] [--output-len MEAN] [--shared-prefix-len N] [--num-shared-prefixes K]
        [--slo-ttft-ms MS] [--slo-tpot-ms MS] [--num-executors N] [--skip-baseline]
        [--skip-quire] [--seed S] [--out DIR] [--quick]

Both servers are started here on free ports and stopped afterwards: Quire with
services.stack.runner.Stack (Redis, memory manager, executors, router) and the baseline with
transformers' own OpenAI-compatible server (`transformers serve`, continuous batching on, via
benchmarks.serving_hf, which only lets it load on the CPU without `accelerate`), both serving
the same local checkpoint with HF_HUB_OFFLINE=1. Quire runs --num-executors executors (default
2) and the stack launcher gives each torch threads = CPU count // executors, so both systems
use the whole machine.

Load. For each request rate, --num-prompts streaming /v1/completions requests are sent at
Poisson arrival times (exponential gaps with mean 1/rate, seeded). Prompts are text decoded
from random token ids; prompt and output lengths are lognormal (sigma 0.9, means
--input-len / --output-len: ShareGPT's shape, scaled down for the CPU). With
--shared-prefix-len N (vllm bench serve's --random-prefix-len: tenants' system prompts),
--num-shared-prefixes K seeded prefixes of N random token ids are drawn and request i's prompt
is prefix i % K followed by its own lognormal-length suffix. Every system gets the
same prompts, arrival times and output lengths, and is asked for exactly that many tokens:
Quire with `ignore_eos`, transformers with a `generation_config` that sets min_new_tokens
(and, being a fresh config, no EOS). Output tokens are counted from each stream's usage.

Per request: TTFT (send to first text chunk), ITL (every gap between text chunks), e2e,
output tokens and TPOT = (e2e - TTFT) / (output_tokens - 1). Per rate, as `vllm bench serve`
reports them: request and output-token throughput, mean/median/p99 of TTFT, TPOT, ITL and e2e,
and goodput (requests/s meeting both SLOs). Each rate's SLO load is
max(TTFT p99 / TTFT SLO, TPOT p99 / TPOT SLO), and the sustainable rate is where it crosses
1.0: a scheduler that admits everything keeps TTFT low past capacity while TPOT explodes, so
TTFT alone would call it sustainable (see DEFINITIONS). Writes <out>/serving.json and
<out>/serving.png.

The defaults (models/quire-bench, 94M parameters, from `make model`; rates 0.5-4 req/s, 40
requests each, prompts ~128 and outputs ~64 tokens on average) take about 10-15 minutes on 2
cores. Both servers share the machine with this client, so a busy neighbour shows up as
queueing: the JSON records the load average before and after the run; compare runs only at
similar load.
"""
