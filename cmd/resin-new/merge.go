package main

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
)

// merge3 merges two descendants of base line by line (diff3): a change made on one side
// only is taken; the same change on both sides is taken once; different changes to
// overlapping or adjacent lines become a conflict, marked as git and copier mark them.
// It returns the merged text and the number of conflicts.
func merge3(base, ours, theirs []byte, oursLabel, baseLabel, theirsLabel string) ([]byte, int) {
	b, o, t := splitLines(base), splitLines(ours), splitLines(theirs)
	ho, ht := hunks(b, o), hunks(b, t)
	var out bytes.Buffer
	conflicts := 0
	pos := 0 // next base line to copy
	i, j := 0, 0
	for i < len(ho) || j < len(ht) {
		// Start a region with the earliest hunk, then absorb every hunk of either side that
		// overlaps or touches it.
		var lo, hi int
		takeO := i < len(ho) && (j >= len(ht) || ho[i].start <= ht[j].start)
		if takeO {
			lo, hi = ho[i].start, ho[i].end
		} else {
			lo, hi = ht[j].start, ht[j].end
		}
		i0, j0 := i, j
		for {
			grew := false
			for i < len(ho) && ho[i].start <= hi && ho[i].end >= lo {
				if ho[i].end > hi {
					hi = ho[i].end
				}
				i++
				grew = true
			}
			for j < len(ht) && ht[j].start <= hi && ht[j].end >= lo {
				if ht[j].end > hi {
					hi = ht[j].end
				}
				j++
				grew = true
			}
			if !grew {
				break
			}
		}
		for _, l := range b[pos:lo] {
			out.WriteString(l)
		}
		pos = hi
		oursSide := apply(b, lo, hi, ho[i0:i])
		theirsSide := apply(b, lo, hi, ht[j0:j])
		switch {
		case i == i0:
			writeLines(&out, theirsSide)
		case j == j0:
			writeLines(&out, oursSide)
		case slices.Equal(oursSide, theirsSide):
			writeLines(&out, oursSide)
		default:
			conflicts++
			out.WriteString("<<<<<<< " + oursLabel + "\n")
			writeLinesNL(&out, oursSide)
			out.WriteString("||||||| " + baseLabel + "\n")
			writeLinesNL(&out, b[lo:hi])
			out.WriteString("=======\n")
			writeLinesNL(&out, theirsSide)
			out.WriteString(">>>>>>> " + theirsLabel + "\n")
		}
	}
	for _, l := range b[pos:] {
		out.WriteString(l)
	}
	return out.Bytes(), conflicts
}

// hunk replaces base lines [start, end) by lines.
type hunk struct {
	start, end int
	lines      []string
}

// apply returns base[lo:hi] with hs (all inside [lo, hi]) applied.
func apply(base []string, lo, hi int, hs []hunk) []string {
	var out []string
	p := lo
	for _, h := range hs {
		out = append(out, base[p:h.start]...)
		out = append(out, h.lines...)
		p = h.end
	}
	return append(out, base[p:hi]...)
}

// hunks diffs a against b through a longest common subsequence of lines.
func hunks(a, b []string) []hunk {
	// Trim the common prefix and suffix, then run the quadratic LCS on the middle.
	pre := 0
	for pre < len(a) && pre < len(b) && a[pre] == b[pre] {
		pre++
	}
	suf := 0
	for suf < len(a)-pre && suf < len(b)-pre && a[len(a)-1-suf] == b[len(b)-1-suf] {
		suf++
	}
	am, bm := a[pre:len(a)-suf], b[pre:len(b)-suf]
	n, m := len(am), len(bm)
	// lcs[i][j] = LCS length of am[i:], bm[j:]
	lcs := make([][]int32, n+1)
	for i := range lcs {
		lcs[i] = make([]int32, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if am[i] == bm[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else if lcs[i+1][j] >= lcs[i][j+1] {
				lcs[i][j] = lcs[i+1][j]
			} else {
				lcs[i][j] = lcs[i][j+1]
			}
		}
	}
	var out []hunk
	var cur *hunk
	i, j := 0, 0
	flush := func() {
		if cur != nil {
			out = append(out, *cur)
			cur = nil
		}
	}
	for i < n || j < m {
		switch {
		case i < n && j < m && am[i] == bm[j]:
			flush()
			i++
			j++
		case j < m && (i == n || lcs[i][j+1] >= lcs[i+1][j]):
			if cur == nil {
				cur = &hunk{start: pre + i, end: pre + i}
			}
			cur.lines = append(cur.lines, bm[j])
			j++
		default:
			if cur == nil {
				cur = &hunk{start: pre + i, end: pre + i}
			}
			i++
			cur.end = pre + i
		}
	}
	flush()
	return out
}

// splitLines splits after each newline; a last line without one is kept as is.
func splitLines(b []byte) []string {
	return slices.Collect(strings.Lines(string(b)))
}

func writeLines(w *bytes.Buffer, ls []string) {
	for _, l := range ls {
		w.WriteString(l)
	}
}

// writeLinesNL writes lines inside conflict markers, ending the last one with a newline.
func writeLinesNL(w *bytes.Buffer, ls []string) {
	for _, l := range ls {
		w.WriteString(l)
		if len(l) == 0 || l[len(l)-1] != '\n' {
			w.WriteByte('\n')
		}
	}
}

// conflictLabels names the sides of an update's merge.
func conflictLabels(oldV, newV string) (string, string, string) {
	return "yours", fmt.Sprintf("template v%s (base)", oldV), fmt.Sprintf("template v%s", newV)
}

// unifiedDiff returns the changes from a to b as a unified diff (three lines of context)
// of the file path, with a/ and b/ prefixes as git writes them, so `git apply` or
// `patch -p1` applies it. It is empty when a and b are equal.
func unifiedDiff(path string, a, b []byte) []byte {
	al, bl := splitLines(a), splitLines(b)
	hs := hunks(al, bl)
	if len(hs) == 0 {
		return nil
	}
	const ctx = 3
	var out bytes.Buffer
	fmt.Fprintf(&out, "--- a/%s\n+++ b/%s\n", path, path)
	line := func(prefix, l string) {
		out.WriteString(prefix + l)
		if !strings.HasSuffix(l, "\n") {
			out.WriteString("\n\\ No newline at end of file\n")
		}
	}
	for i := 0; i < len(hs); {
		// Group hunks whose context would touch.
		j := i + 1
		for j < len(hs) && hs[j].start-hs[j-1].end <= 2*ctx {
			j++
		}
		lo, hi := max(hs[i].start-ctx, 0), min(hs[j-1].end+ctx, len(al))
		// b's line numbers: shift by what the hunks before lo added or removed.
		shift := 0
		for _, h := range hs[:i] {
			shift += len(h.lines) - (h.end - h.start)
		}
		bLen := hi - lo
		for _, h := range hs[i:j] {
			bLen += len(h.lines) - (h.end - h.start)
		}
		fmt.Fprintf(&out, "@@ -%s +%s @@\n", hunkRange(lo, hi-lo), hunkRange(lo+shift, bLen))
		p := lo
		for _, h := range hs[i:j] {
			for _, l := range al[p:h.start] {
				line(" ", l)
			}
			for _, l := range al[h.start:h.end] {
				line("-", l)
			}
			for _, l := range h.lines {
				line("+", l)
			}
			p = h.end
		}
		for _, l := range al[p:hi] {
			line(" ", l)
		}
		i = j
	}
	return out.Bytes()
}

// hunkRange writes a unified diff range: the first line (1-based; the line before an
// empty range) and the count.
func hunkRange(start, n int) string {
	if n == 0 {
		return fmt.Sprintf("%d,0", start)
	}
	return fmt.Sprintf("%d,%d", start+1, n)
}
