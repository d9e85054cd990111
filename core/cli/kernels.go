package cli

import (
	"errors"
	"fmt"
	"io"
	"io/fs"

	"github.com/spf13/cobra"

	"github.com/resin-llm/resin/core/cudart"
)

// Kernels is a set of CUDA sources that compile alike: a model's own kernels.
type Kernels struct {
	// Sources holds the .cu files (an embed.FS of the kernels package).
	Sources fs.FS
	// Source returns a file ready for NVRTC (its includes resolved); nil reads the file as
	// is from Sources.
	Source func(file string) (string, error)
	// Options are the NVRTC flags.
	Options []string
}

// Files lists the .cu files of k, sorted.
func (k Kernels) Files() ([]string, error) {
	if k.Sources == nil {
		return nil, errors.New("kernels: no sources")
	}
	files, err := fs.Glob(k.Sources, "*.cu")
	if err != nil {
		return nil, fmt.Errorf("kernels: %w", err)
	}
	if len(files) == 0 {
		return nil, errors.New("kernels: no .cu files in the sources")
	}
	return files, nil
}

func (k Kernels) source(file string) (string, error) {
	if k.Source != nil {
		return k.Source(file)
	}
	b, err := fs.ReadFile(k.Sources, file)
	if err != nil {
		return "", fmt.Errorf("kernels: %w", err)
	}
	return string(b), nil
}

// Compile compiles every file of k for arch through cache and prints one line per kernel
// to w.
func (k Kernels) Compile(w io.Writer, cache *cudart.KernelCache, arch string) error {
	files, err := k.Files()
	if err != nil {
		return err
	}
	for _, f := range files {
		src, err := k.source(f)
		if err != nil {
			return err
		}
		img, err := cudart.CompileCached(cache, src, f, arch, k.Options...)
		if err != nil {
			return fmt.Errorf("compile %s for %s: %w", f, arch, err)
		}
		fmt.Fprintf(w, "%-24s %s  %7d bytes  (cache %s)\n", f, arch, len(img), cache.Dir)
	}
	return nil
}

// KernelsCmd is `kernels`: compile k with NVRTC through the kernel cache shared by every
// model and process, for GPU 0's architecture (sm_90a without a GPU). No GPU is needed.
func KernelsCmd(k Kernels) *cobra.Command {
	var arch, dir string
	cmd := &cobra.Command{
		Use:   "kernels",
		Short: "Compile the model's own CUDA kernels with NVRTC through the shared kernel cache",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if arch == "" {
				arch = "sm_90a"
				if devs, err := cudart.Devices(); err == nil && len(devs) > 0 {
					arch = devs[0].Arch()
				}
			}
			cache, err := cudart.OpenKernelCache(dir)
			if err != nil {
				return err
			}
			return k.Compile(cmd.OutOrStdout(), cache, arch)
		},
	}
	cmd.Flags().StringVar(&arch, "arch", "", "target architecture (default: GPU 0's, else sm_90a)")
	cmd.Flags().StringVar(&dir, "cache-dir", "", "kernel cache directory (default: $RESIN_KERNEL_CACHE or the user cache dir)")
	return cmd
}
