package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/resin-llm/resin/core/engine/workload"
	"github.com/spf13/cobra"
)

// newBenchSchedulerCmd replays a scheduler workload of docs/workloads.md.
func newBenchSchedulerCmd() *cobra.Command {
	var name string
	var asJSON bool
	var runs int
	cmd := &cobra.Command{
		Use:   "scheduler",
		Short: "Replay scheduler workload W1 or W2 and report the engine's own time per step",
		Long: `Replays W1 (decode-heavy, shared prefix) or W2 (mixed lengths) exactly as
docs/workloads.md defines them, through core/engine's scheduler with a stand-in
model, and reports the engine's own work: scheduling, building the BatchPlan and applying
the step's result.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if runs < 1 {
				return fmt.Errorf("--runs must be at least 1, got %d", runs)
			}
			rep, err := workload.ReplayMedian(name, runs)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				if err := json.NewEncoder(out).Encode(rep); err != nil {
					return err
				}
			} else {
				printReport(out, rep)
			}
			if !rep.OK {
				return fmt.Errorf("workload %s failed its check: %s", name, rep.Reason)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "workload", "W1", "workload to replay: W1 or W2")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object")
	cmd.Flags().IntVar(&runs, "runs", 1, "replay this many times and report the median timings")
	return cmd
}

func printReport(w io.Writer, r workload.Report) {
	fmt.Fprintf(w, "workload %s: %d requests, %d prompt tokens (median of %d runs)\n", r.Workload, r.Requests, r.PromptTokens, r.Runs)
	fmt.Fprintf(w, "steps                 %d (prefill-only %d, decode-only %d, mixed %d)\n", r.Steps, r.PrefillSteps, r.DecodeSteps, r.MixedSteps)
	fmt.Fprintf(w, "output tokens         %d\n", r.OutputTokens)
	fmt.Fprintf(w, "engine time total     %.3f ms\n", float64(r.EngineNsTotal)/1e6)
	fmt.Fprintf(w, "engine per out token  %.1f ns\n", r.NsPerOutputToken)
	fmt.Fprintf(w, "decode step p50/p99   %.1f / %.1f µs\n", float64(r.DecodeP50Ns)/1e3, float64(r.DecodeP99Ns)/1e3)
	fmt.Fprintf(w, "allocs per step       %.2f (decode-only steps %.2f)\n", r.AllocsPerStep, r.DecodeAllocsPerStep)
	fmt.Fprintf(w, "prefix blocks hit     %d\n", r.PrefixBlocksHit)
	fmt.Fprintf(w, "preemptions           %d\n", r.Preemptions)
	ok := "ok: every request produced max_tokens, pool whole"
	if !r.OK {
		ok = "FAILED: " + r.Reason
	}
	fmt.Fprintf(w, "check                 %s\n", ok)
}
