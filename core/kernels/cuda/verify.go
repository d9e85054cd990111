package cuda

import (
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
)

const verifyThreads = 128

// VerifyDrafts is one call of the draft verification kernel (verify.cu), after Sample
// has sampled every logits row of a step: per sequence it walks its rows and counts the
// tokens it emits, the drafts that equal the token sampled before them and then the first
// sampled token that differs (or the bonus after the last draft), as core/cpurunner
// verifies a Drafter's greedy drafts. The emitted tokens are Sampled's rows
// LogitsStart[i] .. LogitsStart[i]+Accepted[i]-1, in place.
type VerifyDrafts struct {
	Accepted    cudart.DevicePtr // [Seqs] int32 out
	Sampled     cudart.DevicePtr // [rows] int32: Sample's tokens
	Drafts      cudart.DevicePtr // [rows] int32: the draft row r's token is compared with, -1: none
	LogitsStart cudart.DevicePtr // [Seqs+1] int32: each sequence's first logits row
	Seqs        int
}

// VerifyDrafts launches p.
func (k *Kernels) VerifyDrafts(c *cudart.Ctx, s *cudart.Stream, p VerifyDrafts) error {
	spec := &k.specs[kVerifyDrafts]
	if err := p.pack(spec); err != nil {
		return err
	}
	return k.launch(c, s, spec)
}

func (p *VerifyDrafts) pack(spec *launchSpec) error {
	if err := positive("VerifyDrafts", p.Seqs); err != nil {
		return err
	}
	if p.Accepted == 0 || p.Sampled == 0 || p.Drafts == 0 || p.LogitsStart == 0 {
		return fmt.Errorf("cuda.VerifyDrafts: accepted, sampled, drafts and logits starts must all be set")
	}
	spec.kernel = kVerifyDrafts
	spec.grid, spec.block, spec.shared = cudart.D1((p.Seqs+verifyThreads-1)/verifyThreads), cudart.D1(verifyThreads), 0
	spec.args.reset().ptr(p.Accepted).ptr(p.Sampled).ptr(p.Drafts).ptr(p.LogitsStart).i32(p.Seqs)
	return nil
}
