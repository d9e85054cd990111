// Command kernelcheck compiles CUDA kernel files the way Resin's runtimes do, with the
// core's prelude and NVRTC flags, and prints ptxas -v's register report per kernel; it is
// the driver of scripts/check-kernels.sh.
//
//	kernelcheck [-compiler nvrtc|clang] [-arch sm_90a,sm_100a] [LABEL=]FILE.cu...
//
// NVRTC checks every architecture of -arch (default: kernelcheck.Arches, Hopper and
// Blackwell); clang compiles for kernelcheck.ClangArch only.
// Each file's quoted #includes resolve to the core's prelude.cuh or to files beside it.
// It exits 1 when a kernel fails to compile, warns, or spills registers, 2 on bad usage,
// and 3 when the compiler is not installed.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/kernels/cuda"
	"github.com/resin-llm/resin/core/kernels/kernelcheck"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// exitNoCompiler is the status for a compiler that is not installed, so that the script
// can fall back to the other one.
const exitNoCompiler = 3

func run(args []string, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("kernelcheck", flag.ContinueOnError)
	fl.SetOutput(stderr)
	compiler := fl.String("compiler", "nvrtc", "nvrtc or clang")
	arch := fl.String("arch", strings.Join(kernelcheck.Arches, ","), "architectures for NVRTC's cubin and ptxas, comma-separated")
	fl.Usage = func() {
		fmt.Fprintln(stderr, "usage: kernelcheck [-compiler nvrtc|clang] [-arch sm_90a,sm_100a] [LABEL=]FILE.cu...")
		fl.PrintDefaults()
	}
	if err := fl.Parse(args); err != nil {
		return 2
	}
	if fl.NArg() == 0 || (*compiler != "nvrtc" && *compiler != "clang") {
		fl.Usage()
		return 2
	}
	arches := strings.Split(*arch, ",")
	if *compiler == "clang" {
		cc, err := kernelcheck.FindClang("")
		if err != nil {
			fmt.Fprintf(stdout, "== %v\n", err)
			return exitNoCompiler
		}
		fmt.Fprintf(stdout, "== %s -> %s PTX (no CUDA headers), ptxas -v\n", cc, kernelcheck.ClangArch)
		return checkFiles(kernelcheck.Clang, kernelcheck.Options{}, fl.Args(), stdout, stderr)
	}
	v, err := cudart.NVRTCVersion()
	if err != nil {
		fmt.Fprintln(stdout, "== NVRTC (core/cudart):", err)
		if errors.Is(err, cudart.ErrNoNVRTC) {
			return exitNoCompiler
		}
		return 1
	}
	status := 0
	for _, a := range arches {
		fmt.Fprintf(stdout, "== NVRTC (core/cudart) -> %s cubin + PTX, ptxas -v -arch=%s\n", a, a)
		fmt.Fprintf(stdout, "NVRTC %s from %s\n", v, cudart.NVRTCPath())
		status = max(status, checkFiles(kernelcheck.NVRTC, kernelcheck.Options{Arch: a}, fl.Args(), stdout, stderr))
	}
	return status
}

// checkFiles checks each [LABEL=]FILE with check and prints the register table; it
// returns 1 when a file fails.
func checkFiles(check func(fs.FS, []string, kernelcheck.Options) ([]kernelcheck.Result, error), o kernelcheck.Options,
	args []string, stdout, stderr io.Writer) int {
	o.Flags, o.Includes = cuda.Options, map[string]string{"prelude.cuh": cuda.Prelude()}
	var all []kernelcheck.Result
	failed := false
	for _, a := range args {
		label, file, ok := strings.Cut(a, "=")
		if !ok {
			label, file = a, a
		}
		rs, err := check(os.DirFS(filepath.Dir(file)), []string{filepath.Base(file)}, o)
		if err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", label, err)
			return 1
		}
		for _, r := range rs {
			if r.Err != nil {
				failed = true
				fmt.Fprintf(stderr, "%s: %v\n", label, r.Err)
			}
			r.Source = label
			all = append(all, r)
		}
	}
	fmt.Fprintln(stdout, kernelcheck.Table(all, nil))
	if failed {
		return 1
	}
	return 0
}
