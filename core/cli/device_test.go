package cli

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
)

func parseDeviceFlags(t *testing.T, args ...string) (*DeviceFlags, error) {
	t.Helper()
	var f DeviceFlags
	cmd := &cobra.Command{Use: "x", RunE: func(*cobra.Command, []string) error { return nil }}
	f.Register(cmd)
	if err := cmd.ParseFlags(args); err != nil {
		return nil, err
	}
	return &f, f.Check()
}

func TestDeviceFlags(t *testing.T) {
	f, err := parseDeviceFlags(t)
	if err != nil || f.CUDA() || f.Device != DeviceCPU {
		t.Fatalf("defaults: %+v, %v", f, err)
	}
	f, err = parseDeviceFlags(t, "--device", "cuda", "--numa", "1", "--gpu", "2", "--cuda-eager")
	if err != nil || !f.CUDA() {
		t.Fatalf("cuda: %+v, %v", f, err)
	}
	f.SetEngineLimits(engine.Config{MaxBatchTokens: 512, MaxSeqs: 1024})
	o := f.GPUOptions(nil)
	if o.Ordinal != 2 || !o.Eager || o.NUMA != (cudart.NUMAMode{Kind: cudart.NUMAFixed, Node: 1}) ||
		o.Limits != (gpurunner.Limits{MaxTokens: 512, MaxSeqs: 512}) {
		t.Errorf("options %+v: want GPU 2, eager, NUMA node 1, limits of 512 tokens and (capped) 512 sequences", o)
	}
	for _, bad := range [][]string{
		{"--device", "tpu"},
		{"--numa", "0"}, // GPU flags without --device cuda would be ignored
		{"--cuda-eager"},
		{"--device", "cuda", "--gpu", "-1"},
		{"--device", "cuda-emu", "--gpu", "1"}, // the emulated device has one GPU
	} {
		if _, err := parseDeviceFlags(t, bad...); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
	if f, err := parseDeviceFlags(t, "--device", "cuda-emu", "--cuda-eager"); err != nil || !f.CUDA() || !f.GPUOptions(nil).Eager {
		t.Errorf("--device cuda-emu: %+v, %v: want the GPU runner's path", f, err)
	}
	if _, err := parseDeviceFlags(t, "--device", "cuda", "--numa", "sometimes"); err == nil || !strings.Contains(err.Error(), "auto, off or a node number") {
		t.Errorf("--numa sometimes: %v", err)
	}
}

func TestOpenGPUErrors(t *testing.T) {
	f := &DeviceFlags{Device: DeviceCUDA}
	if _, _, err := f.OpenGPU("moe", nil, ".", 0); err == nil || !strings.Contains(err.Error(), "model moe has no GPU runner") {
		t.Errorf("no opener: %v", err)
	}
	if _, err := cudart.DeviceCount(); err == nil {
		t.Skip("a CUDA driver is present: the driverless error path cannot be checked here")
	}
	noGPU := func(string, int64, gpurunner.Options) (engine.Runner, *kvslab.Pool, error) {
		return nil, nil, gpurunner.Available(0)
	}
	_, _, err := f.OpenGPU("llama", noGPU, ".", 0)
	if !errors.Is(err, gpurunner.ErrNoDevice) || !errors.Is(err, cudart.ErrNoCUDA) || !strings.Contains(err.Error(), "--device cpu") {
		t.Errorf("without a driver: %v (want ErrNoDevice wrapping ErrNoCUDA, and a pointer to --device cpu)", err)
	}
}

func TestModelDirDeviceCUDA(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var got gpurunner.Options
	var gotDir string
	var gotBytes int64
	gpu := func(d string, bytes int64, o gpurunner.Options) (engine.Runner, *kvslab.Pool, error) {
		gotDir, gotBytes, got = d, bytes, o
		r, err := enginetest.New(enginetest.Config{VocabSize: tinyVocab, MaxContext: 64, Pages: 16})
		if err != nil {
			return nil, nil, err
		}
		return r, r.Pool(), nil
	}
	cpu := func(string, int64) (engine.Runner, *kvslab.Pool, error) {
		t.Error("--device cuda opened the CPU runner")
		return nil, nil, errors.New("cpu")
	}
	m := NewModelDir("dense", cpu).WithGPU(gpu)
	cmd := &cobra.Command{Use: "x"}
	m.Register(cmd)
	if err := cmd.ParseFlags([]string{"--model", dir, "--device", "cuda", "--cache-bytes", "1048576", "--numa", "off"}); err != nil {
		t.Fatal(err)
	}
	var el EngineLimited = m
	el.SetEngineLimits(engine.Config{MaxBatchTokens: 2048, MaxSeqs: 64})
	rt, err := m.Load(io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if rt.Runner == nil || gotDir != dir || gotBytes != 1<<20 {
		t.Errorf("GPU opener got dir %q and %d cache bytes", gotDir, gotBytes)
	}
	if got.Limits != (gpurunner.Limits{MaxTokens: 2048, MaxSeqs: 64}) || got.NUMA.Kind != cudart.NUMAOff {
		t.Errorf("GPU options %+v: want the engine's limits and NUMA off", got)
	}

	// A model without a GPU opener refuses --device cuda by name.
	m = NewModelDir("moe", cpu)
	cmd = &cobra.Command{Use: "x"}
	m.Register(cmd)
	if err := cmd.ParseFlags([]string{"--model", dir, "--device", "cuda"}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Load(io.Discard); err == nil || !strings.Contains(err.Error(), "model moe has no GPU runner") {
		t.Errorf("no GPU opener: %v", err)
	}
}

// TestModelDirGPUSpeculative: a model with a GPU speculative opener (OpenGPUSpeculative)
// decodes speculatively on the device: --device cuda --num-speculative-tokens N opens it
// with N drafts, and the plain GPU opener without drafts; a model without one refuses the
// pair by name, as before for every model. Before, ModelDir refused speculative decoding
// on the GPU whatever the model had.
func TestModelDirGPUSpeculative(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var opened string // which opener ran, and with how many drafts
	runner := func(name string) (engine.Runner, *kvslab.Pool, error) {
		opened = name
		r, err := enginetest.New(enginetest.Config{VocabSize: tinyVocab, MaxContext: 64, Pages: 16})
		if err != nil {
			return nil, nil, err
		}
		return r, r.Pool(), nil
	}
	cpu := func(string, int64) (engine.Runner, *kvslab.Pool, error) { return runner("cpu") }
	cpuSpec := func(_ string, _ int64, n int) (engine.Runner, *kvslab.Pool, error) {
		return runner("cpu spec " + strconv.Itoa(n))
	}
	gpu := func(string, int64, gpurunner.Options) (engine.Runner, *kvslab.Pool, error) { return runner("gpu") }
	var gotOpts gpurunner.Options
	gpuSpec := func(_ string, _ int64, o gpurunner.Options, n int) (engine.Runner, *kvslab.Pool, error) {
		gotOpts = o
		return runner("gpu spec " + strconv.Itoa(n))
	}
	load := func(m *ModelDir, args ...string) (string, error) {
		t.Helper()
		opened = ""
		cmd := &cobra.Command{Use: "x"}
		m.Register(cmd)
		if err := cmd.ParseFlags(append([]string{"--model", dir}, args...)); err != nil {
			t.Fatal(err)
		}
		m.SetEngineLimits(engine.Config{MaxBatchTokens: 256, MaxSeqs: 8})
		_, err := m.Load(io.Discard)
		return opened, err
	}
	full := func() *ModelDir {
		return NewModelDir("mtp", cpu).WithSpeculative(cpuSpec).WithGPU(gpu).WithGPUSpeculative(gpuSpec)
	}
	for _, c := range []struct {
		m    *ModelDir
		args []string
		want string
	}{
		{full(), []string{"--device", "cuda", "--num-speculative-tokens", "3"}, "gpu spec 3"},
		{full(), []string{"--device", "cuda"}, "gpu"},
		{full(), []string{"--num-speculative-tokens", "2"}, "cpu spec 2"},
		{full(), nil, "cpu"},
		// Only a speculative GPU opener: it is the GPU opener too, without drafts.
		{NewModelDir("mtp", cpu).WithGPUSpeculative(gpuSpec), []string{"--device", "cuda"}, "gpu spec 0"},
	} {
		got, err := load(c.m, c.args...)
		if err != nil || got != c.want {
			t.Errorf("%v: opened %q, %v; want %q", c.args, got, err, c.want)
		}
	}
	if _, err := load(full(), "--device", "cuda", "--num-speculative-tokens", "3", "--cuda-eager"); err != nil || !gotOpts.Eager || gotOpts.Limits.MaxTokens != 256 {
		t.Errorf("GPU speculative options %+v, %v: want the flags' (eager) and the engine's limits", gotOpts, err)
	}
	for _, c := range []struct {
		m    *ModelDir
		args []string
		want string
	}{
		{NewModelDir("dense", cpu).WithSpeculative(cpuSpec).WithGPU(gpu), []string{"--device", "cuda", "--num-speculative-tokens", "2"}, "the GPU runner of dense does not decode speculatively"},
		{NewModelDir("gpuonly", cpu).WithGPUSpeculative(gpuSpec), []string{"--num-speculative-tokens", "2"}, "the CPU runner of gpuonly does not decode speculatively"},
	} {
		if got, err := load(c.m, c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: opened %q, %v; want an error saying %q", c.args, got, err, c.want)
		}
	}
}
