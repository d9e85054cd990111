package cli

import (
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/spf13/cobra"

	"github.com/resin-llm/resin/core/engine"
)

// Speculative methods (--speculative-method, vLLM's spelling).
const (
	SpecMTP    = "mtp"    // drafts from the model's own draft head
	SpecDSpark = "dspark" // drafts from a DSpark block drafter (core/dspark) in --draft-model
)

// SpeculativeFlags choose how a model decodes speculatively beyond the number of drafts
// (--num-speculative-tokens, which the loaders register themselves): --speculative-method,
// --draft-model (or --draft-weights) and --dspark-confidence. Without --speculative-method,
// drafts come from the model's own draft head (MTP), as before the flag existed.
type SpeculativeFlags struct {
	Method       string  // "", SpecMTP or SpecDSpark
	DraftModel   string  // SpecDSpark: the drafter's directory (DeepSpec's save_pretrained); "" for a target holding its own stages (DeepSeek-V4-Flash-DSpark)
	DraftWeights string  // --draft-weights, another spelling of --draft-model; Check folds it in
	Confidence   float64 // SpecDSpark: the confidence cut (0: full blocks)
	Trace        string  // SpecDSpark: a JSON-lines file of every verification ("" = none)
}

// Register adds --speculative-method, --draft-model (alias --draft-weights),
// --dspark-confidence and --spec-trace to cmd.
func (f *SpeculativeFlags) Register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.Method, "speculative-method", "", "with --model: where drafts come from: mtp (the model's own draft head, what --num-speculative-tokens alone does) or dspark (a DeepSpec DSpark block drafter in --draft-model; --num-speculative-tokens then defaults to its block size)")
	fl.StringVar(&f.DraftModel, "draft-model", "", "with --speculative-method dspark: the drafter's directory (config.json with architectures [\"Qwen3DSparkModel\"] and safetensors, as DeepSpec's save_pretrained writes it); not for deepseek-v4-flash, whose DSpark checkpoints hold their drafter stages (mtp.0-2)")
	fl.StringVar(&f.DraftWeights, "draft-weights", "", "another spelling of --draft-model (the same directory; giving both with different values is refused)")
	fl.Float64Var(&f.Confidence, "dspark-confidence", 0, "with --speculative-method dspark: cut each block at the first draft whose confidence is below this (0 = full blocks)")
	fl.StringVar(&f.Trace, "spec-trace", "", `with --speculative-method dspark: write one JSON line per verification per sequence to this file: {"request": ID, "anchor_position": P, "drafts": [...], "accepted": A, "next": T}`)
}

// DSpark reports whether the flags ask for a DSpark drafter.
func (f *SpeculativeFlags) DSpark() bool { return f.Method == SpecDSpark }

// Check refuses a method it does not know and flags the chosen method would ignore;
// drafts is --num-speculative-tokens. It folds --draft-weights into DraftModel first,
// refusing the two spellings with different directories.
func (f *SpeculativeFlags) Check(drafts int) error {
	if err := f.foldDraftWeights(); err != nil {
		return err
	}
	switch f.Method {
	case "", SpecMTP:
		switch {
		case f.DraftModel != "":
			return fmt.Errorf("--draft-model %s needs --speculative-method dspark (MTP drafts come from the model's own draft head)", f.DraftModel)
		case f.Confidence != 0:
			return errors.New("--dspark-confidence needs --speculative-method dspark")
		case f.Trace != "":
			return errors.New("--spec-trace needs --speculative-method dspark (MTP verifications are not traced)")
		case f.Method == SpecMTP && drafts <= 0:
			return errors.New("--speculative-method mtp needs --num-speculative-tokens N (N >= 1): the number of draft tokens per step")
		}
	case SpecDSpark:
		switch {
		case math.IsNaN(f.Confidence) || f.Confidence < 0 || f.Confidence > 1:
			return fmt.Errorf("--dspark-confidence %v is not in [0, 1]", f.Confidence)
		case drafts < 0:
			return fmt.Errorf("--num-speculative-tokens %d is negative", drafts)
		}
	default:
		return fmt.Errorf("--speculative-method %q is not known (mtp or dspark)", f.Method)
	}
	return nil
}

// foldDraftWeights makes --draft-weights set DraftModel, refusing it next to a different
// --draft-model.
func (f *SpeculativeFlags) foldDraftWeights() error {
	switch {
	case f.DraftWeights == "":
	case f.DraftModel == "":
		f.DraftModel = f.DraftWeights
	case f.DraftModel != f.DraftWeights:
		return fmt.Errorf("--draft-model %s and --draft-weights %s differ: they name the same flag, give one", f.DraftModel, f.DraftWeights)
	}
	return nil
}

// writeSpecStats prints what a run drafted, when it did: drafts proposed and accepted, the
// mean accepted length (accepted drafts per verification) and per draft slot of a block
// (0: the first draft after the anchor) the drafts accepted of those verified there.
func writeSpecStats(out io.Writer, e *engine.Engine) {
	c := e.Counters()
	if c.DraftsProposed == 0 {
		return
	}
	sc := e.SpecCounters()
	fmt.Fprintf(out, "speculative: %d drafts proposed, %d accepted (%.0f%%), mean accepted length %.2f over %d verifications\n",
		c.DraftsProposed, c.DraftsAccepted, 100*float64(c.DraftsAccepted)/float64(c.DraftsProposed), sc.MeanAcceptedLength(), sc.Verifications)
	fmt.Fprint(out, "  accepted per draft slot:")
	for j := range sc.DraftsAt {
		fmt.Fprintf(out, "  %d: %d/%d (%.0f%%)", j, sc.AcceptedAt[j], sc.DraftsAt[j], 100*sc.AcceptanceRate(j))
	}
	fmt.Fprintln(out)
}
