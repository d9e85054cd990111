package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/kernels/cuda"
)

// newKernelsCmd is `resin kernels`: the shared compiled-kernel cache.
func newKernelsCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "kernels",
		Short: "Inspect and manage the shared compiled-kernel cache",
		Long: `The kernel cache holds every CUDA kernel Resin has compiled with NVRTC, keyed by a
hash of source, options, architecture and compiler version, and shared by all models and
processes. It lives in $RESIN_KERNEL_CACHE or resin/kernels under the user cache directory.`,
	}
	cmd.PersistentFlags().StringVar(&dir, "dir", "", "cache directory (default: $RESIN_KERNEL_CACHE or the user cache dir)")
	open := func() (*cudart.KernelCache, error) { return cudart.OpenKernelCache(dir) }

	cmd.AddCommand(&cobra.Command{
		Use:   "path",
		Short: "Print the cache directory",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d := dir
			if d == "" {
				var err error
				if d, err = cudart.DefaultKernelCacheDir(); err != nil {
					return err
				}
			}
			fmt.Fprintln(cmd.OutOrStdout(), d)
			return nil
		},
	})

	cmd.AddCommand(&cobra.Command{
		Use:   "ls",
		Short: "List cached kernels, most recently used first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := open()
			if err != nil {
				return err
			}
			entries, err := c.List()
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if len(entries) == 0 {
				fmt.Fprintf(out, "no kernels cached in %s\n", c.Dir)
				return nil
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "HASH\tNAME\tARCH\tCOMPILER\tBYTES\tLAST USED")
			var total int64
			for _, e := range entries {
				name := e.Name
				if e.SHA256 == "" {
					name = "(unreadable entry)"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", e.Hash[:12], name, e.Arch, e.Compiler, e.Bytes, e.Used.Local().Format(time.DateTime))
				total += e.Bytes
			}
			tw.Flush()
			fmt.Fprintf(out, "%d kernels, %d bytes in %s\n", len(entries), total, c.Dir)
			return nil
		},
	})

	cmd.AddCommand(&cobra.Command{
		Use:   "clear",
		Short: "Remove every cached kernel",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := open()
			if err != nil {
				return err
			}
			n, err := c.Clear()
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed %d kernels from %s\n", n, c.Dir)
			return nil
		},
	})

	var arch string
	build := &cobra.Command{
		Use:   "build",
		Short: "Compile Resin's shared kernels with NVRTC into the cache (no GPU needed)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := open()
			if err != nil {
				return err
			}
			ver, err := cudart.NVRTCVersion()
			if err != nil {
				return fmt.Errorf("kernels build: %w", err)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "NVRTC %s (%s), arch %s\n", ver, cudart.NVRTCPath(), arch)
			for _, name := range cuda.Names() {
				src, err := cuda.Source(name)
				if err != nil {
					return err
				}
				start := time.Now()
				img, err := cudart.CompileCached(c, src, name, arch, cuda.Options...)
				if err != nil {
					return err
				}
				fmt.Fprintf(out, "  %-20s %7d bytes  %v\n", name, len(img), time.Since(start).Round(time.Millisecond))
			}
			return nil
		},
	}
	build.Flags().StringVar(&arch, "arch", "sm_90a", "target architecture (sm_XX for a cubin, compute_XX for PTX)")
	cmd.AddCommand(build)
	return cmd
}
