// Package loadgen drives an OpenAI-compatible endpoint with streaming requests, at a fixed
// concurrency or with Poisson arrivals, and reports time to first token (TTFT), time per
// output token (TPOT), inter-token latency (ITL), end-to-end latency and throughput, the
// figures vLLM's and SGLang's serving benchmarks report.
package loadgen
