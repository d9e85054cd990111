package kernelcheck

import (
	"regexp"
	"strings"
)

// reDiag starts one NVRTC diagnostic: "file.cu(63): warning #177-D: ...".
var reDiag = regexp.MustCompile(`^\S.*\(\d+\): (warning|error|catastrophic error)\b`)

// ignoredDiags are the NVRTC diagnostics that do not count as warnings. #177 for a
// function ("declared but never referenced"): the runtimes inline the prelude into each
// source, so every prelude helper a kernel does not call would be reported. #177 for a
// variable still counts.
var ignoredDiags = []string{"warning #177-D: function "}

// warnings returns the NVRTC log without the ignored diagnostics and the "Remark:" lines
// that explain how to suppress them; "" when nothing else remains.
func warnings(log string) string {
	var kept []string
	skip := false
	for _, line := range strings.Split(log, "\n") {
		if reDiag.MatchString(line) {
			skip = false
			for _, d := range ignoredDiags {
				skip = skip || strings.Contains(line, d)
			}
		}
		if skip || strings.HasPrefix(line, "Remark: The warnings can be suppressed") {
			continue
		}
		kept = append(kept, line)
	}
	return strings.TrimSpace(strings.Join(kept, "\n"))
}
