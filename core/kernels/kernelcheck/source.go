package kernelcheck

import (
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"strings"

	"github.com/resin-llm/resin/core/cudart"
)

var reInclude = regexp.MustCompile(`(?m)^[ \t]*#[ \t]*include[ \t]+"([^"]+)"[ \t]*$`)

// Load returns the source name from fsys with every quoted #include replaced by the
// header's text, each header once (as the runtimes hand sources to NVRTC, which has no
// include path, so the text is byte for byte what they compile): a header from includes,
// else a file beside the source in fsys. A quoted include found in neither is an error.
// Each inlined header sits between #line directives (cudart.InlineHeader), so compiler
// diagnostics give the line numbers of the file that holds the line.
func Load(fsys fs.FS, name string, includes map[string]string) (string, error) {
	src, err := fs.ReadFile(fsys, name)
	if err != nil {
		return "", fmt.Errorf("kernelcheck: read %s: %w", name, err)
	}
	seen := map[string]bool{}
	// expand inlines the includes of text, the contents of file (named so in #line
	// directives) in directory dir.
	var expand func(text, file, dir string, depth int) (string, error)
	expand = func(text, file, dir string, depth int) (string, error) {
		if depth > 16 {
			return "", fmt.Errorf("kernelcheck: %s: #include nested more than 16 deep", name)
		}
		var out strings.Builder
		last := 0
		for _, m := range reInclude.FindAllStringSubmatchIndex(text, -1) {
			out.WriteString(text[last:m[0]])
			last = m[1]
			inc := text[m[2]:m[3]]
			if seen[inc] {
				continue // the line stays, empty
			}
			seen[inc] = true
			hdr, hdir, err := header(fsys, inc, dir, includes)
			if err != nil {
				return "", fmt.Errorf("kernelcheck: %s: %w", name, err)
			}
			body, err := expand(hdr, inc, hdir, depth+1)
			if err != nil {
				return "", err
			}
			line := strings.Count(text[:m[0]], "\n") + 1
			out.WriteString(cudart.InlineHeader(body, inc, file, line))
		}
		out.WriteString(text[last:])
		return out.String(), nil
	}
	return expand(string(src), name, path.Dir(name), 0)
}

// headers returns every header name reaches through quoted includes (the files a
// compiler with an include path needs beside it), by include name.
func headers(fsys fs.FS, name string, includes map[string]string) (map[string]string, error) {
	src, err := fs.ReadFile(fsys, name)
	if err != nil {
		return nil, fmt.Errorf("kernelcheck: read %s: %w", name, err)
	}
	out := map[string]string{}
	var walk func(text, dir string) error
	walk = func(text, dir string) error {
		for _, m := range reInclude.FindAllStringSubmatch(text, -1) {
			if _, ok := out[m[1]]; ok {
				continue
			}
			hdr, hdir, err := header(fsys, m[1], dir, includes)
			if err != nil {
				return fmt.Errorf("kernelcheck: %s: %w", name, err)
			}
			out[m[1]] = hdr
			if err := walk(hdr, hdir); err != nil {
				return err
			}
		}
		return nil
	}
	return out, walk(string(src), path.Dir(name))
}

// header finds the quoted include inc for a file in dir.
func header(fsys fs.FS, inc, dir string, includes map[string]string) (text, hdir string, err error) {
	if t, ok := includes[inc]; ok {
		return t, dir, nil
	}
	p := path.Join(dir, inc)
	b, err := fs.ReadFile(fsys, p)
	if err != nil {
		return "", "", fmt.Errorf("#include %q: not among the given includes, and %w", inc, err)
	}
	return string(b), path.Dir(p), nil
}
