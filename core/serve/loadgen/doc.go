// Package loadgen drives an OpenAI-compatible endpoint with streaming requests, at a fixed
// concurrency or with Poisson arrivals, and reports time to first token (TTFT), time per
// output token (TPOT), inter-token latency (ITL), end-to-end latency and throughput, the
// figures vLLM's and SGLang's serving benchmarks report.
//
// Prompts are random words drawn from a seed, a fresh one each run unless Config.Seed is
// set, so that repeated runs do not measure the server's prefix cache; the report names
// the seed. Their length is counted in tokens of the served model: by the server's
// /tokenize when it has one, else by a local tokenizer, else approximated by words (with
// a warning). The report gives the mean prompt length the server measured, and the share
// of prompt tokens served from its prefix cache (usage.prompt_tokens_details.cached_tokens).
// Cancelling a run stops sending and cancels the requests in flight, which the report
// counts as cancelled, not failed.
package loadgen
