package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/kernels/ref"
)

// TestDoctorCPUWeights: doctor names each dtype's kernel and says whether AMX runs, with
// the reason ref.AMX gives.
func TestDoctorCPUWeights(t *testing.T) {
	var out bytes.Buffer
	doctorCPUWeights(&out)
	got := out.String()
	want := []string{"CPU weights (--dtype)", "AMX       "}
	for _, dt := range ref.DTypes {
		k, _ := strings.CutPrefix(dt.Kernel(), string(dt)+": ")
		want = append(want, string(dt)+strings.Repeat(" ", 10-len(dt))+k)
	}
	want = append(want, ref.AMX().Reason)
	for _, s := range want {
		if !strings.Contains(got, s) {
			t.Errorf("doctor's CPU weights section lacks %q:\n%s", s, got)
		}
	}
}
