package kernelcheck

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/resin-llm/resin/core/cudart"
)

// NVRTC compiles each source with NVRTC through core/cudart, to a cubin for the options'
// architecture and to PTX for its virtual one (through the kernel cache when Options.Cache
// is set), and assembles the PTX with ptxas -v when ptxas is found. A source that fails to
// compile, prints warnings (unless allowed), lacks an entry point or spills registers gets
// a Result.Err. The error is for what stops every source: NVRTC not installed (matching
// cudart.ErrNoNVRTC) or a bad architecture.
func NVRTC(fsys fs.FS, names []string, o Options) ([]Result, error) {
	return nvrtcCheck(fsys, names, o, true)
}

func nvrtcCheck(fsys fs.FS, names []string, o Options, assemble bool) ([]Result, error) {
	arch := o.arch()
	virt, err := virtualArch(arch)
	if err != nil {
		return nil, err
	}
	ver, err := cudart.NVRTCVersion()
	if err != nil {
		return nil, err
	}
	ptxas := ""
	if assemble {
		ptxas, _ = FindPtxas(o.Ptxas)
	}
	compiler := "nvrtc " + ver
	results := make([]Result, len(names))
	for i, name := range names {
		r := &results[i]
		*r = Result{Source: name, Compiler: compiler, Arch: arch}
		src, err := Load(fsys, name, o.Includes)
		if err != nil {
			r.Err = err
			continue
		}
		var errs []error
		cubin, hitC, logC, err := compileNVRTC(o, src, name, arch, compiler)
		r.Cubin = cubin
		if err != nil {
			errs = append(errs, err)
		} else if !bytes.HasPrefix(cubin, []byte("\x7fELF")) {
			errs = append(errs, fmt.Errorf("%s: NVRTC's %s output is not a cubin", name, arch))
		}
		if len(errs) > 0 {
			r.Log, r.Err = logC, errors.Join(errs...)
			continue // the PTX would fail the same way
		}
		ptx, hitP, logP, err := compileNVRTC(o, src, name, virt, compiler)
		r.PTX, r.Cached = ptx, hitC && hitP
		r.Log = strings.TrimSpace(logC + "\n" + logP)
		if err != nil {
			errs = append(errs, err)
		} else {
			errs = append(errs, checkEntries(name, ptx, o.Entries[name]))
			if ptxas != "" {
				r.Kernels, err = Assemble(ptxas, ptx, arch)
				errs = append(errs, checkReport(name, r.Kernels, err, o.Entries[name]))
			}
		}
		r.Err = errors.Join(errs...)
	}
	return results, nil
}

// compileNVRTC compiles src for arch, through the cache when there is one, and says
// whether the cache served it. With warnings not allowed, a compile that prints any (but
// the ignored ones) fails and is not stored.
func compileNVRTC(o Options, src, name, arch, compiler string) (img []byte, hit bool, log string, err error) {
	compile := func() ([]byte, error) {
		c, err := cudart.Compile(src, name, arch, o.Flags...)
		log = c.Log
		if err != nil {
			return nil, err
		}
		if w := warnings(c.Log); w != "" && !o.AllowWarnings {
			return nil, fmt.Errorf("compile %s for %s: %w:\n%s", name, arch, ErrWarnings, w)
		}
		return c.Image(), nil
	}
	if o.Cache == nil {
		img, err = compile()
		return img, false, log, err
	}
	// The key is cudart.CompileCached's, so the entries are the ones runtimes load.
	key := cudart.KernelKey{Name: name, Source: src, Options: o.Flags, Arch: arch, Compiler: compiler}
	hit = true
	img, err = o.Cache.GetOrCompile(key, func() ([]byte, error) {
		hit = false
		return compile()
	})
	return img, hit && err == nil, log, err
}

// checkEntries checks that the PTX defines each wanted entry, or at least one.
func checkEntries(name string, ptx []byte, want []string) error {
	var errs []error
	for _, k := range want {
		if !bytes.Contains(ptx, []byte(".entry "+k+"(")) {
			errs = append(errs, fmt.Errorf("%s: %w: the PTX has no .entry %s", name, ErrEntry, k))
		}
	}
	if len(want) == 0 && !bytes.Contains(ptx, []byte(".entry ")) {
		errs = append(errs, fmt.Errorf("%s: %w: the PTX defines no kernel", name, ErrEntry))
	}
	return errors.Join(errs...)
}

// checkReport checks ptxas's report: it names every wanted kernel and none spills.
func checkReport(name string, ks []Kernel, err error, want []string) error {
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	var errs []error
	for _, w := range want {
		found := false
		for _, k := range ks {
			found = found || k.Name == w
		}
		if !found {
			errs = append(errs, fmt.Errorf("%s: %w: ptxas said nothing about %s", name, ErrEntry, w))
		}
	}
	for _, k := range ks {
		if k.Spills() {
			errs = append(errs, fmt.Errorf("%s: %s: %w: %d bytes stored, %d loaded", name, k.Name, ErrSpill, k.SpillStores, k.SpillLoads))
		}
	}
	return errors.Join(errs...)
}
