package glm5flash

import (
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
)

// Verifying drafts on the device: a step that feeds a sequence n tokens, the last k of
// them drafts (gpuSeq.Drafts), runs its KDA layers token by token (the recurrent form, as
// the CPU runner's keepDraftStates) and copies each layer's conv and recurrent states
// after tokens n−k−1 ... n−2 into the sequence's slot of the undo buffer; once the
// sampler has accepted a of the step's tokens (a−1 drafts), restoreDrafts copies the
// states after the last accepted token back into the live state page when a draft was
// rejected. The MLA rows the rejected drafts wrote lie past the sequence's length, where
// the engine truncates it.

// undoAt is the device address of undo state j of s (the KDA part of a state page).
func (g *gpuModel) undoAt(s *gpuSeq, j int) cudart.DevicePtr {
	return off(g.undo, (s.slot*g.maxDrafts+j)*g.kdaFloats)
}

// keepDraftState is KDA layer li's AfterToken for s in a step of T tokens: after token t
// (0-based in the step) it keeps the layer's states when a rejection may return to them.
func (g *gpuModel) keepDraftState(c *cudart.Ctx, s *gpuSeq, li, t, T int) error {
	j := t - (T - s.Drafts - 1)
	if j < 0 || j >= s.Drafts {
		return nil
	}
	o := g.L.kdaOff[li]
	return c.CopyDtoDAsync(off(g.undoAt(s, j), o), off(s.State, o), int64(4*(g.convFloats+g.recFloats)), nil)
}

// restoreDrafts puts back s's KDA states after the step that fed it Drafts drafts
// accepted accepted tokens (1 to Drafts+1): those after the last accepted token, unless
// every draft was (the live states are then the last token's).
func (g *gpuModel) restoreDrafts(c *cudart.Ctx, s *gpuSeq, accepted int) error {
	if accepted < 1 || accepted > s.Drafts+1 {
		return fmt.Errorf("gpu: %d tokens accepted of a step with %d drafts", accepted, s.Drafts)
	}
	if accepted-1 == s.Drafts || g.kdaFloats == 0 {
		return nil
	}
	return c.CopyDtoDAsync(s.State, g.undoAt(s, accepted-1), int64(4*g.kdaFloats), nil)
}
