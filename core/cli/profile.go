package cli

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"

	"github.com/spf13/cobra"
)

// AddProfiling adds --cpuprofile and --memprofile to root, for every subcommand: a pprof
// CPU profile of the command, and a heap profile written when it ends. Hooks root already
// has run too (the CPU profile starts before them and ends after them).
//
// The profiles end on every path out of the command: after root's PersistentPostRunE when
// it runs, and otherwise from a cobra.OnFinalize hook, which cobra runs after every
// command, also when a hook or RunE fails (then PersistentPostRunE is skipped) or when a
// subcommand's own PersistentPostRunE hides root's. An error ending the profiles there
// is printed to root's stderr, as there is no error to return it with.
func AddProfiling(root *cobra.Command) {
	p := &profiles{}
	root.PersistentFlags().StringVar(&p.cpuPath, "cpuprofile", "", "write a pprof CPU profile of the command to this file")
	root.PersistentFlags().StringVar(&p.memPath, "memprofile", "", "write a pprof heap profile to this file when the command ends")
	pre, post := root.PersistentPreRunE, root.PersistentPostRunE
	root.PersistentPreRunE = func(cmd *cobra.Command, args []string) error {
		if err := p.start(); err != nil {
			return err
		}
		if pre != nil {
			return pre(cmd, args)
		}
		return nil
	}
	root.PersistentPostRunE = func(cmd *cobra.Command, args []string) error {
		var err error
		if post != nil {
			err = post(cmd, args)
		}
		return errors.Join(err, p.finish())
	}
	cobra.OnFinalize(func() {
		if err := p.finish(); err != nil {
			fmt.Fprintln(root.ErrOrStderr(), err)
		}
	})
}

// profiles is one root command's --cpuprofile and --memprofile.
type profiles struct {
	cpuPath, memPath string
	cpu              *os.File // the running CPU profile's file
	running          bool     // started and not yet finished
}

// start starts the CPU profile when one was asked for.
func (p *profiles) start() error {
	p.running = true
	if p.cpuPath == "" {
		return nil
	}
	f, err := os.Create(p.cpuPath)
	if err != nil {
		return fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return fmt.Errorf("--cpuprofile: %w", err)
	}
	p.cpu = f
	return nil
}

// finish stops the CPU profile and closes its file, then writes the heap profile. It
// does so once per start; later calls do nothing.
func (p *profiles) finish() error {
	if !p.running {
		return nil
	}
	p.running = false
	var errs []error
	if p.cpu != nil {
		pprof.StopCPUProfile()
		if err := p.cpu.Close(); err != nil {
			errs = append(errs, fmt.Errorf("--cpuprofile: %w", err))
		}
		p.cpu = nil
	}
	if p.memPath != "" {
		errs = append(errs, writeHeapProfile(p.memPath))
	}
	return errors.Join(errs...)
}

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--memprofile: %w", err)
	}
	runtime.GC()
	if err := pprof.WriteHeapProfile(f); err != nil {
		f.Close()
		return fmt.Errorf("--memprofile: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("--memprofile: %w", err)
	}
	return nil
}
