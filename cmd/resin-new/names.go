package main

import (
	"fmt"
	"go/token"
	"regexp"
	"slices"
	"strings"
)

// reservedNames are the directories of a scaffold (and of the checkout's models/): a
// model of that name would collide with them, and its binary's .gitignore entry (/NAME)
// would hide the directory.
var reservedNames = []string{"cmd", "kernels", "scripts", "testdata", "vendor", "internal"}

var (
	nameRe    = regexp.MustCompile(`^[a-z][a-z0-9]*(-[a-z0-9]+)*$`)
	modElemRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._~-]*$`)
)

// validateName checks a model name: lower-case letters, digits and single hyphens, starting
// with a letter, at most 40 characters, and usable as a Go package once hyphens are dropped.
func validateName(name string) (pkg string, err error) {
	if name == "" {
		return "", fmt.Errorf("invalid model name: empty")
	}
	if len(name) > 40 {
		return "", fmt.Errorf("invalid model name %q: longer than 40 characters", name)
	}
	if !nameRe.MatchString(name) {
		return "", fmt.Errorf("invalid model name %q: use lower-case letters, digits and single hyphens, starting with a letter (e.g. qwen3-tiny)", name)
	}
	if slices.Contains(reservedNames, name) {
		return "", fmt.Errorf("invalid model name %q: a scaffold has a directory of that name (%s are taken), and the name also becomes the binary that .gitignore hides", name, strings.Join(reservedNames, ", "))
	}
	pkg = strings.ReplaceAll(name, "-", "")
	if err := validatePackage(pkg); err != nil {
		return "", fmt.Errorf("invalid model name %q: %w", name, err)
	}
	return pkg, nil
}

func validatePackage(pkg string) error {
	if !regexp.MustCompile(`^[a-z][a-z0-9]*$`).MatchString(pkg) {
		return fmt.Errorf("package name %q must be lower-case letters and digits", pkg)
	}
	if token.IsKeyword(pkg) || pkg == "main" || pkg == "models" || pkg == "kernels" {
		return fmt.Errorf("package name %q is reserved", pkg)
	}
	return nil
}

// validateModule checks a Go module path: slash-separated elements of letters, digits and
// ._~- , no empty element, no "..", no leading or trailing slash or dot.
func validateModule(mod string) error {
	if mod == "" {
		return fmt.Errorf("invalid module path: empty")
	}
	if mod == CoreModule || strings.HasPrefix(mod, CoreModule+"/") {
		return fmt.Errorf("invalid module path %q: that is the Resin core's own module; a standalone runtime needs a module of its own (e.g. github.com/you/NAME)", mod)
	}
	if strings.HasPrefix(mod, "/") || strings.HasSuffix(mod, "/") {
		return fmt.Errorf("invalid module path %q: leading or trailing slash", mod)
	}
	for _, el := range strings.Split(mod, "/") {
		if !modElemRe.MatchString(el) || strings.HasSuffix(el, ".") || strings.Contains(el, "..") {
			return fmt.Errorf("invalid module path %q: element %q must be letters, digits and ._~- (not starting with a dot or hyphen)", mod, el)
		}
	}
	return nil
}
