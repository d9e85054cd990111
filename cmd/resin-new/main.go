// Command resin-new scaffolds a Resin runtime for a new model from the embedded templates:
// `resin-new model NAME` renders one (standalone with --out, or inside this checkout with
// --in-tree), `update` re-renders it with a newer template and merges three ways, `list`
// shows the bases and `check` runs the scaffold's CHECKLIST.md.
package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/resin-llm/resin/templates"
)

func newRootCmd(stdout io.Writer, tfs fs.FS) *cobra.Command {
	root := &cobra.Command{
		Use:           "resin-new",
		Short:         "Scaffold a Resin inference runtime for a new model",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.AddCommand(newModelCmd(stdout, tfs), newUpdateCmd(stdout, tfs), newListCmd(stdout, tfs), newCheckCmd(stdout), newExtractBaseCmd(stdout))
	return root
}

func newModelCmd(stdout io.Writer, tfs fs.FS) *cobra.Command {
	var o modelOptions
	cmd := &cobra.Command{
		Use:   "model NAME",
		Short: "Scaffold a runtime for model NAME that builds, passes its tests and generates",
		Example: `  resin-new model demo --out /tmp/demo --verify
  resin-new model qwen3-small --hf-config config.json --out ./qwen3-small
  resin-new model tiny --in-tree --set hidden_size=64
  resin-new model mymodel --runner python --out ./mymodel --verify`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return fmt.Errorf("model takes the new model's NAME (%d arguments given): resin-new model NAME --out DIR, e.g. `resin-new model demo --out /tmp/demo --verify` (resin-new model --help)", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			o.name = args[0]
			return scaffoldModel(stdout, tfs, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.base, "base", "", "base to start from (see resin-new list; default dense, or python-runner with --runner python)")
	f.StringVar(&o.runner, "runner", RunnerGo, "what runs the model: go (its forward in Go, in the runtime's process) or python (a Python runner package in the scaffold, started by the runtime and driven through the runner protocol; port kernels to Go later)")
	f.StringVar(&o.hfConfig, "hf-config", "", "HF config.json: fills the dimensions and picks the base from architectures")
	f.StringVar(&o.out, "out", "", "write a standalone repository to DIR")
	f.BoolVar(&o.inTree, "in-tree", false, "write models/NAME in this checkout and register it in models/registry.go")
	f.StringVar(&o.module, "module", "", "module path of a standalone repository (default example.com/NAME)")
	f.StringArrayVar(&o.sets, "set", nil, "set a model answer, key=value (repeatable; e.g. hidden_size=256)")
	f.BoolVar(&o.dryRun, "dry-run", false, "print the files that would be written, write nothing")
	f.BoolVar(&o.force, "force", false, "write into a non-empty target, overwriting files")
	f.BoolVar(&o.verify, "verify", false, "build the result, run its tests and generate a few tokens with random weights")
	f.BoolVar(&o.linkCore, "link-core", false, "replace the core with this checkout's path instead of vendoring it (for core development; a clone elsewhere does not build)")
	f.BoolVar(&o.vendorCore, "vendor-core", false, "copy the core into third_party/resin (the default)")
	f.MarkHidden("vendor-core")
	f.StringVar(&o.core, "core", "", "the Resin checkout (default: found above the working directory)")
	f.BoolVar(&o.noTidy, "no-tidy", false, "skip `go mod tidy` in a standalone repository")
	f.MarkHidden("no-tidy")
	return cmd
}

func newUpdateCmd(stdout io.Writer, tfs fs.FS) *cobra.Command {
	o := updateOptions{dir: "."}
	cmd := &cobra.Command{
		Use:   "update [DIR]",
		Short: "Re-render a scaffold with the current template, merging three ways with local edits",
		Long: `Re-render a scaffold with the current template. Scaffold-owned files are merged three
ways (the recorded last render, the new render, your tree) and conflicts are marked;
files that are yours are never changed: a template change to one is left as a patch
under .resin/patches, and one you deleted stays deleted. A vendored core
(third_party/resin) is refreshed from the Resin checkout. Exits non-zero when conflicts
are marked (or, with --dry-run, would be).`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				o.dir = args[0]
			}
			return updateScaffold(stdout, tfs, o)
		},
	}
	cmd.Flags().BoolVar(&o.dryRun, "dry-run", false, "report what would change, write nothing (exits non-zero if it would mark conflicts)")
	cmd.Flags().BoolVar(&o.rebuildBase, "rebuild-base", false, "rebuild a lost .resin/base.render from the recorded template version (the checkout's git history when the embedded template is newer)")
	cmd.Flags().StringVar(&o.core, "core", "", "the Resin checkout to refresh third_party/resin from (default: found above the working directory)")
	return cmd
}

func newListCmd(stdout io.Writer, tfs fs.FS) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the bases and the HF architectures they serve",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			bases, err := loadBases(tfs)
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "BASE\tVERSION\tALIASES\tARCHITECTURES\tSUMMARY")
			for _, b := range bases {
				archs := append([]string(nil), b.Manifest.Architectures...)
				sort.Strings(archs)
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", b.Name, b.Manifest.Version, strings.Join(b.Manifest.Aliases, ","), strings.Join(archs, ","), b.Manifest.Summary)
			}
			return tw.Flush()
		},
	}
}

func newCheckCmd(stdout io.Writer) *cobra.Command {
	var gpu, list bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "check [DIR]",
		Short: "Run the scaffold's CHECKLIST.md commands and report each item",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := "."
			if len(args) == 1 {
				dir = args[0]
			}
			if list {
				data, err := os.ReadFile(dir + "/CHECKLIST.md")
				if err != nil {
					return fmt.Errorf("check: %w", err)
				}
				for i, it := range parseChecklist(data) {
					switch {
					case it.Command == "":
						fmt.Fprintf(stdout, "%2d. %s (manual)\n", i+1, it.Title)
					case it.GPU:
						fmt.Fprintf(stdout, "%2d. %s (gpu): `%s`\n", i+1, it.Title, it.Command)
					default:
						fmt.Fprintf(stdout, "%2d. %s: `%s`\n", i+1, it.Title, it.Command)
					}
				}
				return nil
			}
			return runChecklist(stdout, dir, gpu, timeout)
		},
	}
	cmd.Flags().BoolVar(&gpu, "gpu", false, "also run the items marked (gpu)")
	cmd.Flags().BoolVar(&list, "list", false, "list the items without running them")
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "limit for each item's command")
	return cmd
}

func newExtractBaseCmd(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:    "extract-base MODEL_DIR OUT_DIR",
		Short:  "Turn an in-tree model into a base's templates (maintainers: make a reference model a --base)",
		Hidden: true,
		Args:   cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return extractBase(stdout, args[0], args[1])
		},
	}
}

func main() {
	if err := newRootCmd(os.Stdout, templates.FS).Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "resin-new:", err)
		os.Exit(exitCode(err))
	}
}

// exitCode is 130 for an interrupted verify (as a shell reports a SIGINT), else 1.
func exitCode(err error) int {
	if errors.Is(err, ErrVerifyInterrupted) {
		return 130
	}
	return 1
}
