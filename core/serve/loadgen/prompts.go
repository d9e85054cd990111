package loadgen

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
)

// words build the synthetic prompts: common English words, a few tokens each at most in
// byte-level BPE vocabularies.
var words = strings.Fields(`the of and to in is was for on that with as by at from his her
it an were are which this be or has had not but first one their its new after who they two
have been also more other than into time most when would only about over some these many
city state world year part people during later made found known where like under while
between three since before however both through water small system group number house`)

// promptRand is the random source of prompt i under seed: each prompt has its own stream,
// so prompts do not depend on the order in which they are built.
func promptRand(seed int64, i int) *rand.Rand {
	return rand.New(rand.NewPCG(uint64(seed), 0x9e3779b97f4a7c15^uint64(i)))
}

// buildPrompt returns random words whose count under c is target, and that count. It
// starts from guess words (0: target) and narrows down on prefixes of the words. When no
// prefix ends exactly on target (the last word needed takes more tokens than are missing
// and no other word fills the gap), it returns the words whose count is nearest,
// preferring fewer tokens.
//
// Counting whole prefixes rather than adding per-word counts keeps the result exact for
// tokenizers whose tokens cross word boundaries.
func buildPrompt(ctx context.Context, c counter, rng *rand.Rand, target, guess int) (string, int, error) {
	if guess <= 0 {
		guess = target
	}
	ws := make([]string, 0, guess)
	for range guess {
		ws = append(ws, words[rng.IntN(len(words))])
	}
	counts := map[int]int{}
	countPrefix := func(k int) (int, error) {
		if n, ok := counts[k]; ok {
			return n, nil
		}
		n, err := c.count(ctx, strings.Join(ws[:k], " "))
		counts[k] = n
		return n, err
	}
	// Find hi with count(hi) >= target, growing the words at the rate seen so far.
	lo, loN := 0, 0 // count(0) is taken as 0: below any target
	hi := len(ws)
	hiN, err := countPrefix(hi)
	if err != nil {
		return "", 0, err
	}
	for hiN < target {
		if hi > 16*target {
			return "", 0, fmt.Errorf("%d words count as %d tokens, short of %d", hi, hiN, target)
		}
		lo, loN = hi, hiN
		for range max(1, (target-hiN)*hi/max(hiN, 1)) {
			ws = append(ws, words[rng.IntN(len(words))])
		}
		hi = len(ws)
		if hiN, err = countPrefix(hi); err != nil {
			return "", 0, err
		}
	}
	// Narrow to hi = lo+1 with count(lo) < target <= count(hi) by interpolation, halving
	// instead after a step that did not halve the interval, so that an uneven tokenizer
	// cannot slow it down much.
	for width := 2 * (hi - lo); hi-lo > 1; {
		k := lo + (hi-lo)/2
		if 2*(hi-lo) <= width && hiN > loN {
			k = lo + (target-loN)*(hi-lo)/(hiN-loN)
		}
		width = hi - lo
		k = min(max(k, lo+1), hi-1)
		n, err := countPrefix(k)
		if err != nil {
			return "", 0, err
		}
		if n >= target {
			hi, hiN = k, n
		} else {
			lo, loN = k, n
		}
	}
	ws = ws[:hi]
	best, bestN := strings.Join(ws, " "), hiN
	if hiN == target {
		return best, bestN, nil
	}
	if lo > 0 && target-loN <= hiN-target {
		best, bestN = strings.Join(ws[:lo], " "), loN
	}
	// The last word overshoots: try each other word in its place.
	for _, j := range rng.Perm(len(words)) {
		ws[hi-1] = words[j]
		text := strings.Join(ws, " ")
		n, err := c.count(ctx, text)
		if err != nil {
			return "", 0, err
		}
		if n == target {
			return text, n, nil
		}
		if d, bestD := abs(n-target), abs(bestN-target); d < bestD || (d == bestD && n < bestN) {
			best, bestN = text, n
		}
	}
	return best, bestN, nil
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
