// Package templates holds the scaffolds resin-new renders, embedded in the binary.
//
// Each base is a directory with a manifest.toml (template version, the HF architectures it
// serves, and one [[file]] entry per output: its path, its template, and whether the file
// is scaffold-owned, rewritten by `resin-new update`, or user-owned, written once) and the
// templates themselves (text/template with sprig's hermetic functions; names end in .tmpl so
// the Go tool never compiles them).
package templates

import "embed"

// FS holds every base directory.
//
//go:embed all:dense all:deepseek-v4 all:glm-5 all:python-runner
var FS embed.FS
