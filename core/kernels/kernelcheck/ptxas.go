package kernelcheck

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// FindPtxas returns path when set, else $RESIN_PTXAS, else ptxas on PATH; ErrNoPtxas
// when there is none.
func FindPtxas(path string) (string, error) {
	if path == "" {
		path = os.Getenv("RESIN_PTXAS")
	}
	if path == "" {
		p, err := exec.LookPath("ptxas")
		if err != nil {
			return "", ErrNoPtxas
		}
		path = p
	}
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("%w: %v", ErrNoPtxas, err)
	}
	return path, nil
}

// Assemble runs ptxas -v on ptx for arch and returns its report per kernel. A ptxas that
// fails returns an error holding its output.
func Assemble(ptxas string, ptx []byte, arch string) ([]Kernel, error) {
	dir, err := os.MkdirTemp("", "kernelcheck-")
	if err != nil {
		return nil, fmt.Errorf("ptxas: %w", err)
	}
	defer os.RemoveAll(dir)
	in := filepath.Join(dir, "kernel.ptx")
	if err := os.WriteFile(in, ptx, 0o644); err != nil {
		return nil, fmt.Errorf("ptxas: %w", err)
	}
	out, err := exec.Command(ptxas, "-v", "-arch="+arch, "-o", in+".cubin", in).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("ptxas -arch=%s: %w\n%s", arch, err, strings.TrimSpace(string(out)))
	}
	ks := ParsePtxas(string(out))
	if len(ks) == 0 {
		return nil, fmt.Errorf("ptxas -arch=%s reported no entry function:\n%s", arch, strings.TrimSpace(string(out)))
	}
	return ks, nil
}

var (
	reFunc  = regexp.MustCompile(`Compiling entry function '(\w+)'`)
	reRegs  = regexp.MustCompile(`Used (\d+) registers`)
	reSmem  = regexp.MustCompile(`(\d+) bytes smem`)
	reSpill = regexp.MustCompile(`(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads`)
)

// ParsePtxas reads ptxas -v output into a report per entry function, in its order.
// Lines before the first entry function (and device functions' properties, which
// precede no entry) are ignored.
func ParsePtxas(out string) []Kernel {
	var ks []Kernel
	for _, line := range strings.Split(out, "\n") {
		if m := reFunc.FindStringSubmatch(line); m != nil {
			ks = append(ks, Kernel{Name: m[1]})
			continue
		}
		if len(ks) == 0 {
			continue
		}
		k := &ks[len(ks)-1]
		if m := reSpill.FindStringSubmatch(line); m != nil {
			k.Stack, _ = strconv.Atoi(m[1])
			k.SpillStores, _ = strconv.Atoi(m[2])
			k.SpillLoads, _ = strconv.Atoi(m[3])
		}
		if m := reRegs.FindStringSubmatch(line); m != nil {
			k.Regs, _ = strconv.Atoi(m[1])
		}
		if m := reSmem.FindStringSubmatch(line); m != nil {
			k.Smem, _ = strconv.Atoi(m[1])
		}
	}
	return ks
}
