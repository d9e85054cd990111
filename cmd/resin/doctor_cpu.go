package main

import (
	"fmt"
	"io"
	"strings"

	"golang.org/x/sys/cpu"

	"github.com/resin-llm/resin/core/kernels/ref"
)

// doctorCPUWeights reports what each --dtype of the CPU runner multiplies on here, the
// vector extensions that decide it, and whether AMX may run (requested from the OS).
func doctorCPUWeights(w io.Writer) {
	fmt.Fprintln(w, "\nCPU weights (--dtype)")
	for _, dt := range ref.DTypes {
		k, _ := strings.CutPrefix(dt.Kernel(), string(dt)+": ")
		fmt.Fprintf(w, "  %-9s %s\n", dt, k)
	}
	yes := func(b bool) string {
		if b {
			return "yes"
		}
		return "no"
	}
	fmt.Fprintf(w, "  features  AVX2 %s, FMA %s, AVX-512F %s, AVX-512 VNNI %s, AVX-512 BF16 %s, AVX-VNNI %s\n",
		yes(cpu.X86.HasAVX2), yes(cpu.X86.HasFMA), yes(cpu.X86.HasAVX512F), yes(cpu.X86.HasAVX512VNNI),
		yes(cpu.X86.HasAVX512BF16), yes(cpu.X86.HasAVXVNNI))
	a := ref.AMX()
	if a.Granted {
		fmt.Fprintf(w, "  AMX       %s (BF16 %s, INT8 %s); the bf16 and int8 lines say what runs on it\n", a.Reason, yes(a.BF16), yes(a.Int8))
	} else {
		fmt.Fprintf(w, "  AMX       not available: %s\n", a.Reason)
	}
}
