package cudart

import (
	"fmt"
	"strconv"
	"strings"
)

// InlineHeader returns the text that replaces the `#include "name"` on line `line` of
// file when a header is spliced into a source (NVRTC has no include path, so Resin hands it
// sources with their headers inlined). The header is framed by #line directives: its own
// lines are numbered as name's, and the line after the include is numbered line+1 of
// file again, so NVRTC's diagnostics name the line a reader sees in the file rather than
// one shifted by the header's length. The text replaces the include line without its
// newline. Every place that inlines a header (core/kernels/cuda.InlinePrelude,
// core/kernels/kernelcheck.Load) goes through it, so their outputs agree byte for byte.
func InlineHeader(header, name, file string, line int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "#line 1 %s\n", strconv.Quote(name))
	b.WriteString(header)
	if !strings.HasSuffix(header, "\n") {
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "#line %d %s", line+1, strconv.Quote(file))
	return b.String()
}
