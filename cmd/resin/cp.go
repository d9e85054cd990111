package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/resin-llm/resin/core/cli"
	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/cp"
	"github.com/resin-llm/resin/core/dist/lockstep"
	"github.com/resin-llm/resin/core/dist/tp"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
	deepseekv4flash "github.com/resin-llm/resin/models/deepseek-v4-flash"
	glm5flash "github.com/resin-llm/resin/models/glm-5-flash"
	"github.com/resin-llm/resin/models/llama"
)

// cpFlags choose prefill context parallelism (core/dist/cp): a prompt's first plan split
// over --cp in-process ranks, decode on rank 0.
type cpFlags struct {
	size  int
	procs bool
}

func (c *cpFlags) register(cmd *cobra.Command) {
	cmd.Flags().IntVar(&c.size, "cp", 1, "with --model llama, deepseek-v4-flash or glm-5-flash on the CPU: prefill context parallelism over this many ranks of this process (core/dist/cp): a prompt's plans split in contiguous chunks, what each layer's attention reads of the other chunks (keys and values; the MoE models' latents, compressor and indexer inputs) all-gathered, rank 0 keeping the whole cache and decoding alone; on --device cuda|cuda-emu, GPU ranks (gpurunner.NewDenseCP, deepseekv4flash.NewGPUCP, glm5flash.NewGPUCP) each holding the model and a whole cache, what each layer's attention reads of the other chunks all-gathered over NCCL, every rank decoding alike; with --tp M, over M-rank tensor-parallel groups (llama; on the GPU gpurunner.NewDenseCPTP, each rank its TP shard); with the MoE models on the GPU and --ep N (equal), over the ep ranks, each holding its experts alone")
	cmd.Flags().BoolVar(&c.procs, "cp-procs", false, "with --cp: run ranks 1..N-1 as worker processes of this binary (each loading the whole model) meeting rank 0 in shared memory (on the GPU: bound to their GPUs' NUMA nodes, the NCCL id handed over it; default: goroutines of this process)")
}

// check refuses the layouts --cp does not cover yet.
func (c *cpFlags) check(f *runtimeFlags) error {
	switch {
	case c.size < 1:
		return fmt.Errorf("--cp %d: want 1 or more ranks", c.size)
	case c.procs && c.size < 2:
		return errors.New("--cp-procs needs --cp 2 or more")
	case c.size == 1:
		return nil
	case f.model == "":
		return errors.New("--cp needs --model llama, deepseek-v4-flash or glm-5-flash: the test runner is not split")
	case f.dp.size > 1:
		return fmt.Errorf("--cp %d is not combined with --dp yet", c.size)
	case f.tp.size > 1 && f.tp.ep > 1:
		return fmt.Errorf("--cp %d --tp %d --ep %d: CP over tensor-parallel groups runs with --ep 1 (on the GPU the MoE models' CP runs over --ep ranks, without --tp)", c.size, f.tp.size, f.tp.ep)
	case f.tp.size > 1 && f.device.CUDA() && f.model != llama.Name:
		return fmt.Errorf("--cp %d --tp %d on the GPU covers --model llama, not %s (its CP runs over --ep ranks)", c.size, f.tp.size, f.model)
	case f.tp.size > 1 && (c.procs || f.tp.procs) && f.tp.initAddr != "":
		return fmt.Errorf("--cp %d --tp %d: worker processes and --dist-init-addr are exclusive: a node's ranks are goroutines of its process", c.size, f.tp.size)
	case f.tp.procs && f.tp.size < 2:
		return fmt.Errorf("--cp %d with --tp-procs: --cp-procs runs CP's ranks as worker processes", c.size)
	case f.tp.ep > 1 && (!f.device.CUDA() || gpuLayoutOpeners[f.model] == nil):
		return fmt.Errorf("--cp %d --ep %d: prefill CP over the ep ranks runs on the GPU (--device cuda, --model deepseek-v4-flash or glm-5-flash), --ep equal to --cp", c.size, f.tp.ep)
	case f.tp.ep > 1 && f.tp.ep != c.size:
		return fmt.Errorf("--cp %d --ep %d: prefill CP over the ep ranks splits each prompt over those same ranks, so --ep must equal --cp", c.size, f.tp.ep)
	case c.procs && f.tp.initAddr != "":
		return fmt.Errorf("--cp %d: --cp-procs and --dist-init-addr are exclusive: a node's ranks are goroutines of its process", c.size)
	case f.specTokens > 0:
		return fmt.Errorf("--cp %d is not combined with --num-speculative-tokens yet", c.size)
	case f.device.CUDA() && f.model != llama.Name && gpuCPOpeners[f.model] == nil:
		return fmt.Errorf("--cp %d on the GPU covers --model llama, deepseek-v4-flash and glm-5-flash, not %s", c.size, f.model)
	}
	f.tp.groupRanks, f.tp.groupFlag = c.size*f.tp.size, layoutSpelling(f.tp.size, 1, c.size) // its ranks split over --nnodes (tpFlags.check)
	return nil
}

// openCPGPU opens llama's (or a model of gpuCPOpeners') GPU runner with prefill context parallelism over --cp ranks of
// this process (gpurunner.NewDenseCPShards) or, with --cp-procs, ranks 1..N-1 worker
// processes of this binary (startGPUWorkers, gpurunner.JoinDenseCP): rank r on GPU --gpu+r where the driver sees
// that many, else every rank on --gpu (NCCL ≥ 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1),
// each with the whole model (read from the checkpoint once per rank) and a cache of rank
// 0's size. With --device cuda-emu the emulator shows --cp GPUs unless RESIN_EMU_DEVICES
// says otherwise.
func (f *runtimeFlags) openCPGPU(name, dir string) (engine.Runner, *kvslab.Pool, error) {
	if name != llama.Name {
		return f.openLayoutGPU(name, dir) // gpuCPOpeners, gpuCPJoiners
	}
	size := f.cp.size
	if err := f.showEmulatedGPUs(size, fmt.Sprintf("--cp %d", size)); err != nil {
		return nil, nil, err
	}
	open := func(dir string, cacheBytes int64, opts gpurunner.Options) (engine.Runner, *kvslab.Pool, error) {
		if err := gpurunner.Available(opts.Ordinal); err != nil {
			return nil, nil, fmt.Errorf("%s on the GPU: %w", llama.Name, err)
		}
		shard, done, err := llamaGPUShard(dir, 1)
		if err != nil {
			return nil, nil, err
		}
		defer done()
		ordinals, err := gpurunner.RankOrdinals(opts.Ordinal, size)
		if err != nil {
			return nil, nil, err
		}
		opts.CacheBytes = cacheBytes
		if f.tp.initAddr != "" {
			return openDenseGPUNode(shard, opts, &f.tp, gpurunner.JoinDenseCP, "cp")
		}
		if f.cp.procs {
			g, pool, err := startGPUWorkers(shard, dir, ordinals, opts, f.device.Device == cli.DeviceCUDAEmu, size)
			if err != nil {
				return nil, nil, fmt.Errorf("--cp %d --cp-procs on GPUs %v: %w", size, ordinals, err)
			}
			return g, pool, nil
		}
		g, pool, err := gpurunner.NewDenseCPShards(shard, ordinals, opts)
		if err != nil {
			return nil, nil, fmt.Errorf("--cp %d on GPUs %v: %w", size, ordinals, err)
		}
		return g, pool, nil
	}
	return f.device.OpenGPU(name, open, dir, f.cacheBytes)
}

// openCPTPGPU opens llama's GPU runner with prefill CP over --cp TP groups of --tp ranks
// each (gpurunner.NewDenseCPTP): rank w, tp rank w%tp of cp rank w/tp, on GPU --gpu+w
// where the driver sees that many, else every rank on --gpu (NCCL ≥ 2.30 with
// NCCL_MULTI_RANK_GPU_ENABLE=1), reading only its TP slices of the checkpoint. The ranks
// are goroutines of this process; with --cp-procs (or --tp-procs) ranks 1.. are worker
// processes (gpurunner.JoinDenseCPTP over shared memory), and with --dist-init-addr they
// split over the nodes. With --device cuda-emu the emulator shows cp·tp GPUs unless
// RESIN_EMU_DEVICES says otherwise.
func (f *runtimeFlags) openCPTPGPU(dir string) (engine.Runner, *kvslab.Pool, error) {
	cpSize, tpSize := f.cp.size, f.tp.size
	what := fmt.Sprintf("--cp %d --tp %d", cpSize, tpSize)
	if err := f.showEmulatedGPUs(cpSize*tpSize, what); err != nil {
		return nil, nil, err
	}
	open := func(dir string, cacheBytes int64, opts gpurunner.Options) (engine.Runner, *kvslab.Pool, error) {
		if err := gpurunner.Available(opts.Ordinal); err != nil {
			return nil, nil, fmt.Errorf("%s on the GPU: %w", llama.Name, err)
		}
		shard, done, err := llamaGPUShard(dir, tpSize)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", what, err)
		}
		defer done()
		ordinals, err := gpurunner.RankOrdinals(opts.Ordinal, cpSize*tpSize)
		if err != nil {
			return nil, nil, err
		}
		opts.CacheBytes = cacheBytes
		if f.tp.initAddr != "" {
			return openDenseGPUNode(shard, opts, &f.tp, denseJoiner(cpSize, tpSize), "cp")
		}
		if f.cp.procs || f.tp.procs {
			g, pool, err := startGPUWorkers(shard, dir, ordinals, opts, f.device.Device == cli.DeviceCUDAEmu, cpSize)
			if err != nil {
				return nil, nil, fmt.Errorf("%s with worker processes on GPUs %v: %w", what, ordinals, err)
			}
			return g, pool, nil
		}
		g, pool, err := gpurunner.NewDenseCPTP(shard, ordinals, cpSize, opts)
		if err != nil {
			return nil, nil, fmt.Errorf("%s on GPUs %v: %w", what, ordinals, err)
		}
		return g, pool, nil
	}
	return f.device.OpenGPU(llama.Name, open, dir, f.cacheBytes)
}

// openCP opens the llama checkpoint (or random-weights config) in dir with prefill CP over
// size ranks: goroutines of this process (a Model each on the same weights) or, with
// procs, worker processes of this binary meeting rank 0 in shared memory, or with nodes
// ranks on several nodes meeting over TCP (joinCPNodes; each loading the model). Rank 0's
// forward serves the engine on the pool's cache.
func openCP(dir string, cacheBytes int64, size int, procs bool, nodes *tpFlags) (engine.Runner, *kvslab.Pool, error) {
	var g *tpWorkers
	if nodes != nil {
		var err error
		if g, err = joinCPNodes(nodes, func(ctl, data dist.Communicator) error { return followCP(dir, ctl, data) }); err != nil {
			return nil, nil, err
		}
	}
	fail := func(err error) (engine.Runner, *kvslab.Pool, error) {
		if g != nil { // the other nodes' ranks stop, not wait for a plan for good
			err = errors.Join(err, g.close())
		}
		return nil, nil, err
	}
	r, err := llama.Load(dir, llama.Options{})
	if err != nil {
		return fail(err)
	}
	pool, err := r.NewPool(cacheBytes)
	if err != nil {
		return fail(err)
	}
	m := r.Model
	c := m.Config
	kv, err := llama.NewKVCache(c, pool)
	if err != nil {
		return fail(err)
	}
	if procs || g != nil {
		if g == nil {
			if g, err = startWorkers(tpWorkerSpec{Name: fmt.Sprintf("resin%d-cp", os.Getpid()), Size: size, Dir: dir, CP: size}); err != nil {
				return nil, nil, fmt.Errorf("--cp %d: %w", size, err)
			}
		}
		lead := cp.Lead(g.ctl, &cp.Prefill{C: g.data, Shape: cpShape(c), Vocab: c.VocabSize, Forward: cpForward(m, kv), Cache: kv.Layers})
		return &tpRunner{cpurunner.New(r.Info(), cpurunner.ForwardFunc(g.forward(lead))), g.close, g.w}, pool, nil
	}
	forwards := make([]cp.ModelForward, size)
	forwards[0] = cpForward(m, kv)
	for rank := 1; rank < size; rank++ {
		rm, err := llama.NewModel(c, m.W, m.MaxContext())
		if err != nil {
			return nil, nil, fmt.Errorf("--cp rank %d: %w", rank, err)
		}
		forwards[rank] = cpForward(rm, nil)
	}
	ip, err := cp.StartInProcess(cpShape(c), c.VocabSize, forwards, kv.Layers, dist.Options{Timeout: time.Minute})
	if err != nil {
		return nil, nil, fmt.Errorf("--cp %d: %w", size, err)
	}
	return &tpRunner{cpurunner.New(r.Info(), cpurunner.ForwardFunc(ip.Forward)), ip.Close, nil}, pool, nil
}

// cpForward is m's forward for cp: with attend as every layer's attention, or on kv (rank
// 0's cache; nil on the others, which only run split plans).
func cpForward(m *llama.Model, kv *llama.KVCache) cp.ModelForward {
	return func(p *engine.BatchPlan, attend cp.AttendFunc, logits []float32) error {
		m.Attend = attend
		return m.Forward(p, kv, logits)
	}
}

func cpShape(c *llama.Config) cp.Shape {
	return cp.Shape{Heads: c.NumAttentionHeads, KVHeads: c.NumKeyValueHeads, HeadDim: c.HeadDim, Window: c.Window}
}

// runCPWorker is a --cp-procs worker: it loads the model, joins rank 0 and runs its
// chunk of each split prefill until rank 0 stops the group.
func runCPWorker(spec tpWorkerSpec) error {
	if spec.Model != "" {
		return runCPModelWorker(spec)
	}
	if spec.TP > 1 {
		return runCPTPWorker(spec)
	}
	ctl, data, err := joinTP(spec, nil)
	if err != nil {
		return err
	}
	defer ctl.Close()
	defer data.Close()
	if err := followCP(spec.Dir, ctl, data); err != nil {
		return fmt.Errorf("cp rank %d: %w", spec.Rank, err)
	}
	return nil
}

// followCP is a llama cp rank other than 0 (a worker process's, or a node's): it loads
// the model in dir and runs its chunk of each split prefill rank 0 sends on ctl until
// rank 0 stops the group.
func followCP(dir string, ctl, data dist.Communicator) error {
	r, err := llama.Load(dir, llama.Options{})
	if err != nil {
		return err
	}
	c := r.Model.Config
	return cp.Follow(ctl, &cp.Prefill{C: data, Shape: cpShape(c), Vocab: c.VocabSize, Forward: cpForward(r.Model, nil)})
}

// joinCPNodes joins this node's ranks of a --cp group across nodes (tpFlags.nodeRanks:
// the cp ranks split evenly over --nnodes) over TCP at --dist-init-addr: a control group
// that waits as long as the engine idles and a data group, as the TP nodes' are. A rank
// other than 0 runs follow until rank 0 stops the group. On node 0 it returns rank 0's
// ends (their close stops the others and waits for this node's); on the others it
// returns errWorkerDone once this node's ranks have followed to the end.
func joinCPNodes(t *tpFlags, follow func(ctl, data dist.Communicator) error) (*tpWorkers, error) {
	size := t.ranks()
	join := func(rank int) (ctl, data dist.Communicator, err error) {
		if ctl, err = dist.JoinTCP(t.initAddr, rank, size, dist.Options{Timeout: 100 * 365 * 24 * time.Hour, JoinTimeout: t.joinTimeout(), Group: "cp-ctl"}); err != nil {
			return nil, nil, err
		}
		if data, err = dist.JoinTCP(t.initAddr, rank, size, dist.Options{Timeout: time.Minute, JoinTimeout: t.joinTimeout(), Group: "cp-data"}); err != nil {
			ctl.Close()
			return nil, nil, err
		}
		return ctl, data, nil
	}
	run := func(rank int) error {
		ctl, data, err := join(rank)
		if err != nil {
			return err
		}
		defer ctl.Close()
		defer data.Close()
		return follow(ctl, data)
	}
	first, n := t.nodeRanks()
	wait := withLocalRanks(first, n, run)
	if first != 0 {
		if err := run(first); err != nil {
			return nil, fmt.Errorf("cp worker: rank %d: %w", first, err)
		}
		if err := wait(); err != nil {
			return nil, fmt.Errorf("cp worker: %w", err)
		}
		return nil, errWorkerDone
	}
	ctl, data, err := join(0)
	if err != nil {
		return nil, fmt.Errorf("--cp %d over %d nodes: %w", size, t.nnodes, err)
	}
	return &tpWorkers{ctl: ctl, data: data, wait: wait}, nil
}

// cpModel is a model's prefill CP beside llama's (core/dist/cp.Stateful): its ranks as
// goroutines of this process, and one rank (rank 0 with a pool of cacheBytes for the
// engine, the others without) over data, for worker processes.
type cpModel struct {
	inProcess func(dir string, cacheBytes int64, size int) (*tpRunner, *kvslab.Pool, error)
	rank      func(dir string, cacheBytes int64, data dist.Communicator) (engine.RunnerInfo, *kvslab.Pool, lockstep.Rank, error)
}

var cpModels = map[string]cpModel{
	deepseekv4flash.Name: {
		inProcess: func(dir string, cacheBytes int64, size int) (*tpRunner, *kvslab.Pool, error) {
			g, pool, err := deepseekv4flash.OpenCPInProcess(dir, deepseekv4flash.Options{}, size, cacheBytes, dist.Options{Timeout: time.Minute})
			if err != nil {
				return nil, nil, err
			}
			return &tpRunner{g.Runner, g.StopRanks, nil}, pool, nil
		},
		rank: func(dir string, cacheBytes int64, data dist.Communicator) (engine.RunnerInfo, *kvslab.Pool, lockstep.Rank, error) {
			r, err := deepseekv4flash.Load(dir, deepseekv4flash.Options{})
			if err != nil {
				return engine.RunnerInfo{}, nil, lockstep.Rank{}, err
			}
			var pool *kvslab.Pool
			if data.Rank() == 0 {
				if pool, err = r.NewPool(cacheBytes); err != nil {
					return engine.RunnerInfo{}, nil, lockstep.Rank{}, err
				}
			}
			cr, err := deepseekv4flash.NewCPRank(r, data)
			if err != nil {
				return engine.RunnerInfo{}, nil, lockstep.Rank{}, err
			}
			return r.Info(), pool, cr.LockstepRank(), nil
		},
	},
	glm5flash.Name: {
		inProcess: func(dir string, cacheBytes int64, size int) (*tpRunner, *kvslab.Pool, error) {
			g, pool, err := glm5flash.OpenCPInProcess(dir, glm5flash.RankOptions{CacheBytes: cacheBytes}, size, dist.Options{Timeout: time.Minute})
			if err != nil {
				return nil, nil, err
			}
			return &tpRunner{g.Runner, g.StopRanks, nil}, pool, nil
		},
		rank: func(dir string, cacheBytes int64, data dist.Communicator) (engine.RunnerInfo, *kvslab.Pool, lockstep.Rank, error) {
			r, err := glm5flash.LoadText(dir, 0, 0)
			if err != nil {
				return engine.RunnerInfo{}, nil, lockstep.Rank{}, err
			}
			var pool *kvslab.Pool
			if data.Rank() == 0 {
				if pool, err = r.NewPool(cacheBytes); err != nil {
					return engine.RunnerInfo{}, nil, lockstep.Rank{}, err
				}
			}
			cr, err := glm5flash.NewCPRank(r.Model, r, data)
			if err != nil {
				return engine.RunnerInfo{}, nil, lockstep.Rank{}, err
			}
			return r.Info(), pool, cr.LockstepRank(), nil
		},
	},
}

// openCPModel is openCP for a model of cpModels: goroutine ranks of this process on one
// set of weights, or with procs worker processes of this binary (each loading the
// model) meeting rank 0 in shared memory.
func openCPModel(name, dir string, cacheBytes int64, size int, procs bool, nodes *tpFlags) (engine.Runner, *kvslab.Pool, error) {
	what := fmt.Sprintf("--cp %d", size)
	m := cpModels[name]
	if nodes != nil {
		g, err := joinCPNodes(nodes, func(ctl, data dist.Communicator) error { return followCPModel(m, dir, ctl, data) })
		if err != nil {
			return nil, nil, err
		}
		return leadCPModel(what, m, dir, cacheBytes, g)
	}
	if !procs {
		r, pool, err := m.inProcess(dir, cacheBytes, size)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", what, err)
		}
		return r, pool, nil
	}
	g, err := startWorkers(tpWorkerSpec{Name: fmt.Sprintf("resin%d-cp", os.Getpid()), Size: size, Dir: dir, CP: size, Model: name})
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	return leadCPModel(what, m, dir, cacheBytes, g)
}

// leadCPModel is rank 0 of a cpModels model's group whose other ranks are processes
// (worker processes or other nodes' ranks behind g): it loads the model with a pool of
// cacheBytes, waits for every rank to have loaded, and returns the engine's runner
// (whose StopRanks stops the others).
func leadCPModel(what string, m cpModel, dir string, cacheBytes int64, g *tpWorkers) (engine.Runner, *kvslab.Pool, error) {
	info, pool, rank, err := m.rank(dir, cacheBytes, g.data)
	if err == nil {
		err = g.data.Barrier() // every rank has read dir, which the caller may remove
	}
	if err != nil {
		g.kill()
		g.ctl.Close()
		g.data.Close()
		if g.wait != nil {
			err = errors.Join(err, g.wait())
		}
		return nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	lead := lockstep.LeadRank(g.ctl, rank)
	lead.Lead = g.forward(lead.Lead)
	return &tpRunner{cpurunner.New(info, lead), g.close, g.w}, pool, nil
}

// runCPModelWorker is a --cp-procs worker of a model of cpModels: it loads the model,
// joins rank 0 and runs its chunk of each split prefill until rank 0 stops the group.
func runCPModelWorker(spec tpWorkerSpec) error {
	m, ok := cpModels[spec.Model]
	if !ok {
		return fmt.Errorf("cp rank %d: model %q has no prefill CP", spec.Rank, spec.Model)
	}
	ctl, data, err := joinTP(spec, nil)
	if err != nil {
		return err
	}
	defer ctl.Close()
	defer data.Close()
	if err := followCPModel(m, spec.Dir, ctl, data); err != nil {
		return fmt.Errorf("cp rank %d: %w", spec.Rank, err)
	}
	return nil
}

// followCPModel is a cp rank other than 0 of a cpModels model: it loads the model, waits
// for every rank to have, and runs rank 0's plans on ctl until rank 0 stops the group.
func followCPModel(m cpModel, dir string, ctl, data dist.Communicator) error {
	_, _, rank, err := m.rank(dir, 0, data)
	if err == nil {
		err = data.Barrier()
	}
	if err != nil {
		return err
	}
	return lockstep.FollowRank(ctl, rank)
}

// openCPTP opens the llama checkpoint (or random-weights config) in dir with prefill CP
// over cpSize tensor-parallel groups of tpSize ranks (core/dist/tp's CP × TP: world rank
// cpRank·tp + tpRank; cp rank 0's TP group holding the cache and decoding): goroutines
// of this process or, with procs, world ranks 1.. as worker processes of this binary
// meeting rank 0 in shared memory. Each rank reads only its shard from a checkpoint.
func openCPTP(dir string, cacheBytes int64, cpSize, tpSize int, procs bool, nodes *tpFlags) (engine.Runner, *kvslab.Pool, error) {
	what := fmt.Sprintf("--cp %d --tp %d", cpSize, tpSize)
	var g *tpWorkers
	if nodes != nil {
		// The ranks of every node meet at --dist-init-addr; rank 0 then sends the others
		// its cache's geometry (cp rank 0's TP group keeps caches of rank 0's pages).
		var err error
		if g, err = joinCPNodes(nodes, func(ctl, data dist.Communicator) error { return followCPTPNode(dir, ctl, data, cpSize, tpSize) }); err != nil {
			return nil, nil, err
		}
	}
	fail := func(err error) (engine.Runner, *kvslab.Pool, error) {
		if g != nil { // the other ranks stop, not wait for a plan for good
			err = errors.Join(err, g.close())
		}
		return nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	m, err := openLlamaTP(dir)
	if err != nil {
		return fail(err)
	}
	if err := m.d.CheckSize(tpSize); err != nil { // once, before the cp·tp ranks start
		return fail(err)
	}
	pool, err := m.NewPool(cacheBytes)
	if err != nil {
		return fail(err)
	}
	pages, pt := tp.CachePages(m.d, pool), pool.BlockTokens()
	shard := func(rank int) (*tp.Shard, error) { return m.shard(rank, tpSize) }
	if g != nil {
		if _, err := g.data.Broadcast(binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, uint64(pages)), uint64(pt)), 0); err != nil {
			return fail(fmt.Errorf("send the cache's geometry: %w", err))
		}
		return leadCPTP(m, pool, g, shard, cpSize, tpSize, pages, pt, what)
	}
	if !procs {
		ip, err := tp.StartCPShards(shard, tpSize, cpSize, pages, pt, dist.Options{Timeout: time.Minute})
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", what, err)
		}
		return &tpRunner{cpurunner.New(m.Info(), cpurunner.ForwardFunc(ip.Forward)), ip.Close, nil}, pool, nil
	}
	spec := tpWorkerSpec{Name: fmt.Sprintf("resin%d-cp", os.Getpid()), Size: cpSize * tpSize, Dir: dir, CP: cpSize, TP: tpSize, Pages: pages, PageTokens: pt}
	if g, err = startWorkers(spec); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	return leadCPTP(m, pool, g, shard, cpSize, tpSize, pages, pt, what)
}

// leadCPTP joins world rank 0 of a CP × TP group whose other ranks are g's (worker
// processes, or nodes' ranks) and returns the engine's runner over it.
func leadCPTP(m *llamaTPModel, pool *kvslab.Pool, g *tpWorkers, shard func(int) (*tp.Shard, error), cpSize, tpSize, pages, pt int, what string) (engine.Runner, *kvslab.Pool, error) {
	r, err := tp.JoinCP(g.data, shard, tpSize, cpSize, pages, pt)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", what, errors.Join(err, g.close()))
	}
	lead := lockstep.LeadRank(g.ctl, r.LockstepRank())
	stop := func() error { return errors.Join(g.close(), r.Layout.Close()) }
	return &tpRunner{cpurunner.New(m.Info(), cpurunner.ForwardFunc(g.forward(lead.Forward))), stop, g.w}, pool, nil
}

// followCPTPNode runs a rank other than 0 of a CP × TP group across nodes until rank 0
// stops the group: rank 0's cache geometry first, then each plan.
func followCPTPNode(dir string, ctl, data dist.Communicator, cpSize, tpSize int) error {
	geo, err := data.Broadcast(nil, 0)
	if err != nil {
		return fmt.Errorf("rank 0's cache geometry: %w", err)
	}
	if len(geo) != 16 {
		return fmt.Errorf("rank 0 sent a %d-byte cache geometry, want 16", len(geo))
	}
	pages, pt := int(binary.LittleEndian.Uint64(geo)), int(binary.LittleEndian.Uint64(geo[8:]))
	m, err := openLlamaTP(dir)
	if err != nil {
		return err
	}
	r, err := tp.JoinCP(data, func(rank int) (*tp.Shard, error) { return m.shard(rank, tpSize) }, tpSize, cpSize, pages, pt)
	if err != nil {
		return err
	}
	defer r.Layout.Close()
	return lockstep.FollowRank(ctl, r.LockstepRank())
}

// runCPTPWorker is a worker process of a CP × TP group (openCPTP with procs): it joins
// rank 0, reads its shard and runs each plan rank 0 broadcasts until rank 0 stops the
// group (only cp rank 0's TP group keeps a cache, of rank 0's pages).
func runCPTPWorker(spec tpWorkerSpec) error {
	ctl, data, err := joinTP(spec, nil)
	if err != nil {
		return err
	}
	defer ctl.Close()
	defer data.Close()
	m, err := openLlamaTP(spec.Dir)
	if err != nil {
		return fmt.Errorf("rank %d: %w", spec.Rank, err)
	}
	r, err := tp.JoinCP(data, func(rank int) (*tp.Shard, error) { return m.shard(rank, spec.TP) }, spec.TP, spec.CP, spec.Pages, spec.PageTokens)
	if err != nil {
		return fmt.Errorf("rank %d: %w", spec.Rank, err)
	}
	defer r.Layout.Close()
	if err := lockstep.FollowRank(ctl, r.LockstepRank()); err != nil {
		return fmt.Errorf("rank %d (cp rank %d, tp rank %d): %w", spec.Rank, r.Layout.CPRank, r.Layout.TPRank, err)
	}
	return nil
}
