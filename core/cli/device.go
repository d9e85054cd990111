package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/weights"
)

// Devices a model runs on.
const (
	DeviceCPU  = "cpu"
	DeviceCUDA = "cuda"
	// DeviceCUDAEmu is the GPU runner on the emulated CUDA device (core/cudart's
	// RESIN_CUDA=emulate): the real bindings and runner, every kernel run on the CPU.
	DeviceCUDAEmu = "cuda-emu"
)

// GPUOpener opens the checkpoint in dir on a GPU (see Opener): a model package's OpenGPU,
// built on core/gpurunner.
type GPUOpener func(dir string, cacheBytes int64, opts gpurunner.Options) (engine.Runner, *kvslab.Pool, error)

// GPUSpeculativeOpener opens the checkpoint in dir on a GPU decoding speculatively with
// drafts draft tokens per step from the model's draft head (MTP): a model package's
// OpenGPUSpeculative.
type GPUSpeculativeOpener func(dir string, cacheBytes int64, opts gpurunner.Options, drafts int) (engine.Runner, *kvslab.Pool, error)

// DeviceFlags are --device cpu|cuda|cuda-emu and --numa auto|off|N: where a model runs. A
// Loader registers them with its model flags and, with --device cuda or cuda-emu, opens
// the model through its GPUOpener with GPUOptions.
type DeviceFlags struct {
	Device string
	NUMA   cudart.NUMAMode
	GPU    int
	Eager  bool
	// Watchdog is --watchdog-timeout: how long one step of a multi-GPU group may run
	// before the rank aborts its NCCL communicator (gpurunner.Options.Watchdog).
	Watchdog time.Duration
	// Log is where the GPU runners' notes go (GPUOptions' log; nil: os.Stderr).
	Log    io.Writer
	limits gpurunner.Limits
}

// Register adds --device, --numa, --gpu, --cuda-eager and --watchdog-timeout to cmd.
func (f *DeviceFlags) Register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.Device, "device", DeviceCPU, "where the model runs: cpu (the Go reference forward), cuda (the GPU runner; needs an NVIDIA driver and CUDA's NVRTC and cuBLASLt libraries) or cuda-emu (the GPU runner on the emulated CUDA device, every kernel run on the CPU; needs g++)")
	fl.Var(&f.NUMA, "numa", "with --device cuda: bind the process and its pinned buffers to a NUMA node: auto (the GPU's), off, or a node number")
	fl.IntVar(&f.GPU, "gpu", 0, "with --device cuda: the GPU ordinal to run on")
	fl.BoolVar(&f.Eager, "cuda-eager", false, "with --device cuda: launch every step's kernels, capturing no CUDA graphs")
	fl.DurationVar(&f.Watchdog, "watchdog-timeout", gpurunner.DefaultWatchdog, "with --device cuda and several GPU ranks: how long one step may run before the rank aborts its NCCL communicator and the step fails (NCCL itself waits for a dead or hung peer for good; SGLang's --watchdog-timeout)")
}

// Check refuses a device this build does not know and GPU flags given without --device
// cuda (they would be silently ignored).
func (f *DeviceFlags) Check() error {
	if f.Watchdog < 0 {
		return fmt.Errorf("--watchdog-timeout %v: want a positive duration", f.Watchdog)
	}
	switch f.Device {
	case DeviceCPU:
		if f.NUMA != (cudart.NUMAMode{}) || f.GPU != 0 || f.Eager || f.Watchdog != 0 && f.Watchdog != gpurunner.DefaultWatchdog {
			return errors.New("--numa, --gpu, --cuda-eager and --watchdog-timeout apply to --device cuda only")
		}
	case DeviceCUDA:
		if f.GPU < 0 {
			return fmt.Errorf("--gpu %d is negative", f.GPU)
		}
		if cudart.Emulated() {
			return errors.New("--device cuda with RESIN_CUDA=emulate: the emulated device is --device cuda-emu (unset RESIN_CUDA for the GPU)")
		}
	case DeviceCUDAEmu:
		if f.GPU != 0 {
			return fmt.Errorf("--gpu %d: the emulated device has one GPU, 0", f.GPU)
		}
	default:
		return fmt.Errorf("--device %q: want cpu, cuda or cuda-emu", f.Device)
	}
	return nil
}

// CUDA reports whether the GPU runner was chosen: --device cuda or cuda-emu.
func (f *DeviceFlags) CUDA() bool { return f.Device == DeviceCUDA || f.Device == DeviceCUDAEmu }

// SetEngineLimits sizes the GPU workspace for the engine's step limits (the commands call
// it, through EngineLimited, before Load).
func (f *DeviceFlags) SetEngineLimits(cfg engine.Config) {
	f.limits = gpurunner.Limits{MaxTokens: cfg.MaxBatchTokens, MaxSeqs: min(cfg.MaxSeqs, cfg.MaxBatchTokens)}
}

// GPUOptions are the gpurunner options of the flags: the GPU, NUMA binding, graph mode,
// the engine's limits, an upload progress line on a terminal and notes to log.
func (f *DeviceFlags) GPUOptions(log io.Writer) gpurunner.Options {
	return gpurunner.Options{Ordinal: f.GPU, NUMA: f.NUMA, Eager: f.Eager, Limits: f.limits, Watchdog: f.Watchdog,
		Progress: weights.TerminalProgress(), Log: log}
}

// OpenGPU opens the model called name through open with the flags' options; a model
// without a GPU runner (open nil) gets an error that says so.
func (f *DeviceFlags) OpenGPU(name string, open GPUOpener, dir string, cacheBytes int64) (engine.Runner, *kvslab.Pool, error) {
	if open == nil {
		return nil, nil, fmt.Errorf("--device %s: model %s has no GPU runner yet (the dense llama family has one, core/gpurunner); run it with --device cpu", f.Device, name)
	}
	if f.Device == DeviceCUDAEmu {
		if err := cudart.Emulate(); err != nil {
			return nil, nil, fmt.Errorf("--device cuda-emu: %w", err)
		}
		emuNote.Do(func() {
			fmt.Fprintln(os.Stderr, "note: --device cuda-emu: the emulated CUDA device (the .cu kernels built as host C++ and run on the CPU) checks the GPU path; it is not a GPU and says nothing of a GPU's speed")
		})
	}
	log := f.Log
	if log == nil {
		log = os.Stderr
	}
	r, pool, err := open(dir, cacheBytes, f.GPUOptions(log))
	if errors.Is(err, gpurunner.ErrNoDevice) {
		return nil, nil, fmt.Errorf("--device %s: %w (`resin doctor` lists what was found; --device cpu runs the reference forward)", f.Device, err)
	}
	return r, pool, err
}

// emuNote prints, once a process, what --device cuda-emu is.
var emuNote sync.Once

// EngineLimited is a Loader that sizes what it loads by the engine's limits (a GPU
// runner's workspace): the commands call SetEngineLimits before Load.
type EngineLimited interface {
	SetEngineLimits(cfg engine.Config)
}

// WithGPU gives the model's GPU opener: --device cuda then runs it.
func (m *ModelDir) WithGPU(open GPUOpener) *ModelDir {
	m.gpu = open
	return m
}

// WithGPUSpeculative gives the model's GPU opener that decodes speculatively: --device
// cuda with --num-speculative-tokens N then runs it (without one, that pair is refused).
// It is also the GPU opener (drafts 0) unless WithGPU gave one.
func (m *ModelDir) WithGPUSpeculative(open GPUSpeculativeOpener) *ModelDir {
	m.gpuSpec = open
	return m
}

// SetEngineLimits implements EngineLimited.
func (m *ModelDir) SetEngineLimits(cfg engine.Config) { m.device.SetEngineLimits(cfg) }
