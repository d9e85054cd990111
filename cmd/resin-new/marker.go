package main

import (
	"bytes"
	"fmt"
	"go/format"
	"go/parser"
	"go/token"
	"strconv"
	"strings"
)

// Markers in models/registry.go where resin-new inserts a model's import and entry.
const (
	importsMarker = "// +resin:scaffold:imports"
	modelsMarker  = "// +resin:scaffold:models"
)

// insertAtMarker inserts line just above the marker line, with the marker's indentation,
// unless an identical line (ignoring surrounding space) already sits anywhere between the
// enclosing block's start and the marker. Inserting twice changes nothing.
func insertAtMarker(src []byte, marker, line string) ([]byte, bool, error) {
	lines := strings.SplitAfter(string(src), "\n")
	at := -1
	for i, l := range lines {
		if strings.TrimSpace(l) == marker {
			if at >= 0 {
				return nil, false, fmt.Errorf("marker %q appears twice", marker)
			}
			at = i
		}
	}
	if at < 0 {
		return nil, false, fmt.Errorf("marker %q not found", marker)
	}
	want := strings.TrimSpace(line)
	for _, l := range lines {
		if strings.TrimSpace(l) == want {
			return src, false, nil
		}
	}
	indent := lines[at][:len(lines[at])-len(strings.TrimLeft(lines[at], " \t"))]
	var b bytes.Buffer
	for i, l := range lines {
		if i == at {
			b.WriteString(indent + want + "\n")
		}
		b.WriteString(l)
	}
	return b.Bytes(), true, nil
}

// registerModel adds a model's import and registry entry to models/registry.go's source.
func registerModel(src []byte, a *Answers) ([]byte, bool, error) {
	if err := checkImportName(src, a.Package, a.Import); err != nil {
		return nil, false, fmt.Errorf("models/registry.go: %w", err)
	}
	imp := fmt.Sprintf("%q", a.Import)
	if a.Package != lastElem(a.Import) {
		imp = a.Package + " " + imp
	}
	out, c1, err := insertAtMarker(src, importsMarker, imp)
	if err != nil {
		return nil, false, fmt.Errorf("models/registry.go: %w", err)
	}
	entry := fmt.Sprintf("{Name: %q, Architectures: %s.Architectures, Open: %s.Open},", a.Name, a.Package, a.Package)
	c2 := false
	// An entry the model's author extended (OpenSpeculative, ...) is still its entry.
	if !bytes.Contains(out, []byte(fmt.Sprintf("{Name: %q,", a.Name))) {
		if out, c2, err = insertAtMarker(out, modelsMarker, entry); err != nil {
			return nil, false, fmt.Errorf("models/registry.go: %w", err)
		}
	}
	if !c1 && !c2 {
		return src, false, nil
	}
	formatted, err := format.Source(out)
	if err != nil {
		return nil, false, fmt.Errorf("models/registry.go after insertion: %w", err)
	}
	return formatted, true, nil
}

// checkImportName reports an import of src, other than path itself, that already takes
// the name pkg: adding the model's import would leave a registry that does not compile
// (a model called engine, or tinyone next to tiny-one).
func checkImportName(src []byte, pkg, path string) error {
	f, err := parser.ParseFile(token.NewFileSet(), "registry.go", src, parser.ImportsOnly)
	if err != nil {
		return err
	}
	for _, is := range f.Imports {
		p, err := strconv.Unquote(is.Path.Value)
		if err != nil || p == path {
			continue
		}
		name := lastElem(p)
		if is.Name != nil {
			name = is.Name.Name
		}
		if name == pkg {
			return fmt.Errorf("package name %q is already taken by the import of %s; choose another model name", pkg, p)
		}
	}
	return nil
}

func lastElem(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[i+1:]
	}
	return p
}
