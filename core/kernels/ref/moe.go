package ref

import (
	"fmt"
	"math"
)

// Scoring is how router logits become expert scores.
type Scoring int

const (
	// ScoreSoftmax takes the softmax over all experts (Mixtral, Qwen-MoE).
	ScoreSoftmax Scoring = iota
	// ScoreSigmoid takes each expert's sigmoid (DeepSeek-V3, GLM-4.5).
	ScoreSigmoid
)

// MaxExperts is the most experts MoETopK routes over.
const MaxExperts = 1024

// Routing configures MoETopK.
type Routing struct {
	TopK    int
	Scoring Scoring
	// Renormalize divides the chosen weights by their sum.
	Renormalize bool
	// Bias, when set ([experts]), is added to the scores to choose experts but not to the
	// weights (DeepSeek-V3's e_score_correction_bias).
	Bias []float32
	// Groups and GroupTopK, when Groups > 1, restrict the choice to the GroupTopK expert
	// groups whose two best (biased) scores sum highest (DeepSeek-V3's group-limited
	// routing). Experts must divide evenly into groups.
	Groups, GroupTopK int
	// Scale multiplies the final weights (routed_scaling_factor); 0 means 1.
	Scale float32
}

// MoETopK picks the experts of each token from its router logits.
//
//	logits: [tokens, experts]   weights, ids: [tokens, TopK]
//
// Experts are chosen by score (plus Bias) in descending order, the lower expert index first
// on a tie; weights[t, j] is the unbiased score of ids[t, j], renormalised and scaled as the
// Routing asks.
func MoETopK(weights []float32, ids []int32, logits []float32, tokens, experts int, r Routing) error {
	const op = "MoETopK"
	if err := checkDims(op, tokens, experts); err != nil {
		return err
	}
	if experts > MaxExperts {
		return fmt.Errorf("ref.%s: %d experts exceeds the supported %d", op, experts, MaxExperts)
	}
	if r.TopK <= 0 || r.TopK > experts {
		return fmt.Errorf("ref.%s: top-k %d outside [1, %d experts]", op, r.TopK, experts)
	}
	if r.Scoring != ScoreSoftmax && r.Scoring != ScoreSigmoid {
		return fmt.Errorf("ref.%s: unknown scoring %d", op, r.Scoring)
	}
	if r.Bias != nil && len(r.Bias) != experts {
		return fmt.Errorf("ref.%s: bias has %d entries for %d experts", op, len(r.Bias), experts)
	}
	if r.Groups > 1 {
		if experts%r.Groups != 0 || r.GroupTopK <= 0 || r.GroupTopK > r.Groups || r.TopK > r.GroupTopK*(experts/r.Groups) {
			return fmt.Errorf("ref.%s: %d experts, %d groups, group top-k %d and top-k %d do not fit", op, experts, r.Groups, r.GroupTopK, r.TopK)
		}
	}
	if err := checkLen(op, "logits", len(logits), tokens*experts); err != nil {
		return err
	}
	if err := checkLen(op, "weights", len(weights), tokens*r.TopK); err != nil {
		return err
	}
	if err := checkLen(op, "ids", len(ids), tokens*r.TopK); err != nil {
		return err
	}
	var scoreBuf, choiceBuf [MaxExperts]float32
	scores := scoreBuf[:experts]  // unbiased scores
	choice := choiceBuf[:experts] // biased scores; -Inf once taken or masked
	for t := 0; t < tokens; t++ {
		row := logits[t*experts : (t+1)*experts]
		copy(scores, row)
		if r.Scoring == ScoreSoftmax {
			softmaxRow(scores)
		} else {
			for e, v := range row {
				scores[e] = float32(1 / (1 + math.Exp(-float64(v))))
			}
		}
		for e := range choice {
			choice[e] = scores[e]
			if r.Bias != nil {
				choice[e] += r.Bias[e]
			}
		}
		if r.Groups > 1 {
			maskGroups(choice, r.Groups, r.GroupTopK)
		}
		w := weights[t*r.TopK : (t+1)*r.TopK]
		id := ids[t*r.TopK : (t+1)*r.TopK]
		var sum float32
		for j := 0; j < r.TopK; j++ {
			best := 0
			for e := 1; e < experts; e++ {
				if choice[e] > choice[best] {
					best = e
				}
			}
			id[j] = int32(best)
			w[j] = scores[best]
			sum += w[j]
			choice[best] = float32(math.Inf(-1))
		}
		scale := r.Scale
		if scale == 0 {
			scale = 1
		}
		for j := range w {
			if r.Renormalize && sum > 0 {
				w[j] /= sum
			}
			w[j] *= scale
		}
	}
	return nil
}

// maskGroups sets to -Inf the scores of every expert outside the k groups whose two best
// scores sum highest (the lower group index first on a tie).
func maskGroups(choice []float32, groups, k int) {
	size := len(choice) / groups
	var groupScore [MaxExperts]float32
	for g := 0; g < groups; g++ {
		a, b := float32(math.Inf(-1)), float32(math.Inf(-1))
		for _, v := range choice[g*size : (g+1)*size] {
			if v > a {
				a, b = v, a
			} else if v > b {
				b = v
			}
		}
		if size == 1 {
			b = 0
		}
		groupScore[g] = a + b
	}
	var keep [MaxExperts]bool
	for range k {
		best := -1
		for g := 0; g < groups; g++ {
			if !keep[g] && (best < 0 || groupScore[g] > groupScore[best]) {
				best = g
			}
		}
		keep[best] = true
	}
	for g := 0; g < groups; g++ {
		if !keep[g] {
			for e := g * size; e < (g+1)*size; e++ {
				choice[e] = float32(math.Inf(-1))
			}
		}
	}
}
