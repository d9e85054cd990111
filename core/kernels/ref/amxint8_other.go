//go:build !amd64

package ref

// hasAMXInt8 is false off x86-64: AMX is an x86 extension.
const hasAMXInt8 = false

// amxRows is never called off x86-64 (hasAMXInt8 is false).
func (t *int8Task) amxRows(part, lo, hi int) {}
