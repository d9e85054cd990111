package serve

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// /metrics offers vLLM's metric names (vllm/v1/metrics/loggers.py), with vLLM's types and
// labels (model_name, engine; finished_reason on request_success_total), so that vLLM's
// Grafana dashboards read them; the resin_ names stay beside them.
func TestMetricsHaveVLLMNames(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	h.postJSON("/v1/completions", map[string]any{"prompt": "metrics", "max_tokens": 3, "ignore_eos": true}, 200, nil)
	text := scrape(t, h)
	types := map[string]string{}
	for line := range strings.Lines(text) {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			types[f[2]] = f[3]
		}
	}
	for name, typ := range map[string]string{
		"vllm:num_requests_running":                  "gauge",
		"vllm:num_requests_waiting":                  "gauge",
		"vllm:gpu_cache_usage_perc":                  "gauge",
		"vllm:request_max_num_generation_tokens":     "histogram",
		"vllm:kv_cache_usage_perc":                   "gauge",
		"vllm:cache_config_info":                     "gauge",
		"vllm:num_preemptions_total":                 "counter",
		"vllm:prompt_tokens_total":                   "counter",
		"vllm:generation_tokens_total":               "counter",
		"vllm:request_success_total":                 "counter",
		"vllm:prefix_cache_queries_total":            "counter",
		"vllm:prefix_cache_hits_total":               "counter",
		"vllm:spec_decode_num_draft_tokens_total":    "counter",
		"vllm:spec_decode_num_accepted_tokens_total": "counter",
		"vllm:iteration_tokens_total":                "histogram",
		"vllm:request_params_n":                      "histogram",
		"vllm:request_params_max_tokens":             "histogram",
		"vllm:request_prompt_tokens":                 "histogram",
		"vllm:request_generation_tokens":             "histogram",
		"vllm:time_to_first_token_seconds":           "histogram",
		"vllm:time_per_output_token_seconds":         "histogram",
		"vllm:inter_token_latency_seconds":           "histogram",
		"vllm:e2e_request_latency_seconds":           "histogram",
		"vllm:request_queue_time_seconds":            "histogram",
		"vllm:request_inference_time_seconds":        "histogram",
		"vllm:request_prefill_time_seconds":          "histogram",
		"vllm:request_decode_time_seconds":           "histogram",
		"resin_requests_running":                     "gauge",
		"resin_http_requests_total":                  "counter",
	} {
		if types[name] != typ {
			t.Errorf("# TYPE %s: %q, want %q", name, types[name], typ)
		}
	}
	prompt, _ := h.tok.Encode("metrics", true)
	for _, sample := range []string{
		`vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny-test"} 1`,
		`vllm:generation_tokens_total{engine="0",model_name="tiny-test"} 3`,
		`vllm:prompt_tokens_total{engine="0",model_name="tiny-test"} ` + strconv.Itoa(len(prompt)),
		`vllm:request_params_max_tokens_count{engine="0",model_name="tiny-test"} 1`,
		`vllm:request_params_max_tokens_sum{engine="0",model_name="tiny-test"} 3`,
		`vllm:request_params_n_count{engine="0",model_name="tiny-test"} 1`,
		`vllm:request_params_n_sum{engine="0",model_name="tiny-test"} 1`,
		`vllm:num_requests_running{engine="0",model_name="tiny-test"} 0`,
		`vllm:kv_cache_usage_perc{engine="0",model_name="tiny-test"} 0`,
		`vllm:iteration_tokens_total_count{engine="0",model_name="tiny-test"} `,
	} {
		if !strings.Contains(text, sample) {
			t.Errorf("/metrics lacks %s", sample)
		}
	}
	// Every step scheduled some tokens: the prompt's, then one a step.
	if !strings.Contains(text, `vllm:iteration_tokens_total_sum{engine="0",model_name="tiny-test"} `+strconv.Itoa(len(prompt)+2)) {
		t.Errorf("iteration tokens do not add up to the prompt's %d and 2 decode steps", len(prompt))
	}

	// n is counted once per prompt, not once per choice.
	h.postJSON("/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": "n"}},
		"max_tokens": 1, "n": 3}, 200, nil)
	text = scrape(t, h)
	for _, sample := range []string{
		`vllm:request_params_n_count{engine="0",model_name="tiny-test"} 2`,
		`vllm:request_params_n_sum{engine="0",model_name="tiny-test"} 4`,
	} {
		if !strings.Contains(text, sample) {
			t.Errorf("after a request with n 3, /metrics lacks %s", sample)
		}
	}
}

func scrape(t *testing.T, h *harness) string {
	t.Helper()
	resp, err := http.Get(h.ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	return readAll(t, resp)
}
