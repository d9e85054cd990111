package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestBenchSchedulerJSON(t *testing.T) {
	cmd := newBenchSchedulerCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--workload", "W1", "--json"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	var rep map[string]any
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, out.String())
	}
	for _, k := range []string{"steps", "output_tokens", "engine_ns_total", "ns_per_output_token", "decode_p50_ns",
		"decode_p99_ns", "allocs_per_step", "prefix_blocks_hit", "preemptions", "ok"} {
		if _, ok := rep[k]; !ok {
			t.Errorf("field %s missing", k)
		}
	}
	if rep["ok"] != true || rep["output_tokens"].(float64) != 256*256 {
		t.Fatalf("report %v", rep)
	}
}

func TestBenchSchedulerRejectsUnknownWorkload(t *testing.T) {
	cmd := newBenchSchedulerCmd()
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs([]string{"--workload", "W9"})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "W9") {
		t.Fatalf("error %v", err)
	}
}
