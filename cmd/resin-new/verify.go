package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
)

// verify builds a fresh scaffold, runs its tests and generates a few tokens with random
// weights, streaming each command's output to w.
func verify(w io.Writer, root string, a *Answers) error {
	steps := [][]string{
		{"go", "build", "./..."},
		{"go", "test", "-count=1", "./..."},
		{"go", "run", "./cmd/" + a.Name, "generate", "--prompt-ids", "1,2,3,4", "--max-tokens", "8"},
	}
	for _, s := range steps {
		fmt.Fprintf(w, "verify: %s\n", strings.Join(s, " "))
		cmd := exec.Command(s[0], s[1:]...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "GOWORK=off")
		cmd.Stdout, cmd.Stderr = w, w
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("verify %s: %s: %w", root, strings.Join(s, " "), err)
		}
	}
	fmt.Fprintf(w, "verify: %s builds, passes its tests and generates\n", a.Name)
	return nil
}
