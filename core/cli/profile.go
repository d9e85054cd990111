package cli

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"

	"github.com/spf13/cobra"
)

// AddProfiling adds --cpuprofile and --memprofile to root, for every subcommand: a pprof
// CPU profile of the command, and a heap profile written when it ends. Hooks root already
// has run too (the CPU profile starts before them and ends after them).
func AddProfiling(root *cobra.Command) {
	var cpuPath, memPath string
	var cpuFile *os.File
	root.PersistentFlags().StringVar(&cpuPath, "cpuprofile", "", "write a pprof CPU profile of the command to this file")
	root.PersistentFlags().StringVar(&memPath, "memprofile", "", "write a pprof heap profile to this file when the command ends")
	pre, post := root.PersistentPreRunE, root.PersistentPostRunE
	root.PersistentPreRunE = func(cmd *cobra.Command, args []string) error {
		if cpuPath != "" {
			f, err := os.Create(cpuPath)
			if err != nil {
				return fmt.Errorf("--cpuprofile: %w", err)
			}
			if err := pprof.StartCPUProfile(f); err != nil {
				f.Close()
				return fmt.Errorf("--cpuprofile: %w", err)
			}
			cpuFile = f
		}
		if pre != nil {
			return pre(cmd, args)
		}
		return nil
	}
	root.PersistentPostRunE = func(cmd *cobra.Command, args []string) error {
		if post != nil {
			if err := post(cmd, args); err != nil {
				return err
			}
		}
		if cpuFile != nil {
			pprof.StopCPUProfile()
			err := cpuFile.Close()
			cpuFile = nil
			if err != nil {
				return fmt.Errorf("--cpuprofile: %w", err)
			}
		}
		if memPath == "" {
			return nil
		}
		f, err := os.Create(memPath)
		if err != nil {
			return fmt.Errorf("--memprofile: %w", err)
		}
		runtime.GC()
		if err := pprof.WriteHeapProfile(f); err != nil {
			f.Close()
			return fmt.Errorf("--memprofile: %w", err)
		}
		return f.Close()
	}
}
