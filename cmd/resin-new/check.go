package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// ChecklistItem is one "- [ ] ..." line of CHECKLIST.md with the command that proves it.
type ChecklistItem struct {
	Line    int
	Title   string
	Command string // empty: nothing to run (a manual step)
	GPU     bool   // needs a GPU ("(gpu)" on the line)
}

// parseChecklist reads the items of a checklist: every line starting with "- [ ]" or
// "- [x]"; the command is the last `backticked` span, the title the bold text. Tags in
// parentheses mark items that need a GPU, "(gpu)", or are done by hand, "(manual)".
func parseChecklist(data []byte) []ChecklistItem {
	var items []ChecklistItem
	sc := bufio.NewScanner(bytes.NewReader(data))
	n := 0
	for sc.Scan() {
		n++
		l := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(l, "- [ ]") && !strings.HasPrefix(l, "- [x]") {
			continue
		}
		body := strings.TrimSpace(l[5:])
		tags := tagsOf(body)
		it := ChecklistItem{Line: n, GPU: tags["gpu"]}
		if end := strings.LastIndex(body, "`"); end > 0 {
			if start := strings.LastIndex(body[:end], "`"); start >= 0 {
				it.Command = body[start+1 : end]
			}
		}
		if tags["manual"] {
			it.Command = ""
		}
		title := body
		if s := strings.Index(body, "**"); s >= 0 {
			if e := strings.Index(body[s+2:], "**"); e >= 0 {
				title = body[s+2 : s+2+e]
			}
		}
		it.Title = title
		items = append(items, it)
	}
	return items
}

// tagRe matches a parenthesised group of lower-case tags, which a note may follow after a
// ";": "(gpu)", "(gpu, manual)", "(gpu; core/gpurunner's dense model, bf16)".
var tagRe = regexp.MustCompile(`\(\s*([a-z]+(?:\s*,\s*[a-z]+)*)\s*(?:;[^)]*)?\)`)

// tagsOf collects the tags of the parenthesised groups of a line (see tagRe).
func tagsOf(line string) map[string]bool {
	tags := map[string]bool{}
	for _, m := range tagRe.FindAllStringSubmatch(line, -1) {
		for _, w := range strings.Split(m[1], ",") {
			tags[strings.TrimSpace(w)] = true
		}
	}
	return tags
}

// runChecklist runs every item's command in dir and reports PASS, FAIL or SKIP per item.
func runChecklist(w io.Writer, dir string, gpu bool, timeout time.Duration) error {
	data, err := os.ReadFile(filepath.Join(dir, "CHECKLIST.md"))
	if err != nil {
		return fmt.Errorf("check: %w", err)
	}
	items := parseChecklist(data)
	if len(items) == 0 {
		return fmt.Errorf("check: %s has no checklist items (lines starting with \"- [ ]\")", filepath.Join(dir, "CHECKLIST.md"))
	}
	failed := 0
	for i, it := range items {
		switch {
		case it.Command == "":
			fmt.Fprintf(w, "SKIP %2d. %s (manual step)\n", i+1, it.Title)
			continue
		case it.GPU && !gpu:
			fmt.Fprintf(w, "SKIP %2d. %s (needs a GPU; pass --gpu)\n", i+1, it.Title)
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		cmd := exec.CommandContext(ctx, "sh", "-c", it.Command)
		cmd.Dir = dir
		killGroupOnCancel(cmd)
		cmd.WaitDelay = 5 * time.Second // children holding the output open must not outlast the timeout
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		start := time.Now()
		err := cmd.Run()
		cancel()
		if err != nil {
			failed++
			fmt.Fprintf(w, "FAIL %2d. %s: `%s` (%v)\n", i+1, it.Title, it.Command, err)
			tail := out.String()
			if len(tail) > 2000 {
				tail = tail[len(tail)-2000:]
			}
			for _, l := range strings.Split(strings.TrimRight(tail, "\n"), "\n") {
				fmt.Fprintf(w, "       | %s\n", l)
			}
			continue
		}
		if reason, skipped := allSkipped(out.String()); skipped {
			fmt.Fprintf(w, "SKIP %2d. %s: `%s` ran no test: %s\n", i+1, it.Title, it.Command, reason)
			continue
		}
		fmt.Fprintf(w, "PASS %2d. %s: `%s` (%.1fs)\n", i+1, it.Title, it.Command, time.Since(start).Seconds())
	}
	if failed > 0 {
		return fmt.Errorf("check: %d of %d items failed", failed, len(items))
	}
	return nil
}

// allSkipped reports whether go test output (run with -v) shows tests that all skipped, or
// none that ran: such an item proves nothing, so check reports it as SKIP, with the first
// skip message as the reason (go test prints a test's log lines, the message among them,
// between its "=== RUN" and "--- SKIP" lines).
func allSkipped(out string) (string, bool) {
	if strings.Contains(out, "--- PASS") || strings.Contains(out, "--- FAIL") {
		return "", false
	}
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		if !strings.Contains(l, "--- SKIP") {
			continue
		}
		reason := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "--- SKIP:"))
		for j := i - 1; j >= 0 && !strings.HasPrefix(lines[j], "=== "); j-- {
			if m := strings.TrimSpace(lines[j]); strings.Contains(m, ".go:") {
				reason = m
			}
		}
		return reason, true
	}
	if strings.Contains(out, "[no tests to run]") {
		return "no test matched", true
	}
	return "", false
}
