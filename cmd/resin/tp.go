package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/launch"
	"github.com/resin-llm/resin/core/dist/lockstep"
	"github.com/resin-llm/resin/core/dist/tp"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	glm5flash "github.com/resin-llm/resin/models/glm-5-flash"
)

// tpFlags choose the tensor-parallel layout: ranks in this process (--tp), worker
// processes on this host (--tp-procs), or nodes (--dist-init-addr with --nnodes and
// --node-rank, or torchrun's environment), each holding its share of the ranks.
type tpFlags struct {
	size             int
	ep               int    // expert parallelism (the MoE models)
	dispatch         string // its exchange
	procs            bool
	initAddr         string
	nnodes, nodeRank int
	localRank        int           // torchrun's LOCAL_RANK: the first GPU of this node's ranks is --gpu+localRank
	distTimeout      time.Duration // how long a multi-node rendezvous waits for every rank
	// groupRanks is --dp N's with --dp-attention (N·T with --tp T), or --cp N's (N·M with
	// --tp M; set by dpFlags.check and cpFlags.check, groupFlag spelling the layout's
	// flags): the group's ranks across nodes when above 1.
	groupRanks int
	groupFlag  string
	stats      bool      // --dist-stats: print rank 0's step figures when the engine stops
	statsOut   io.Writer // where (the command's stderr; nil: os.Stderr)
}

func (t *tpFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.IntVar(&t.size, "tp", 1, "on the CPU: tensor parallelism over this many ranks, for --model llama (core/dist/tp) and deepseek-v4-flash and glm-5-flash (heads, output groups and expert columns split; with --ep too), in-process unless --tp-procs or --dist-init-addr; with --device cuda|cuda-emu, llama's GPU runner over this many ranks, in-process unless --tp-procs or --dist-init-addr (rank r on GPU --gpu+r, or all on --gpu where the driver sees fewer: NCCL_MULTI_RANK_GPU_ENABLE=1), or glm-5-flash's and deepseek-v4-flash's over in-process ranks; heads, KV heads and the intermediate size must divide by it")
	fl.IntVar(&t.ep, "ep", 1, "with --model deepseek-v4-flash or glm-5-flash on the CPU: expert parallelism over this many ranks (the routed experts split in contiguous ranges, attention replicated), in-process unless --tp-procs; with --tp they run over max(--tp, --ep) ranks, the smaller dividing the larger: tp groups of --tp consecutive ranks each split the attention and run every token, and the experts split over ep groups of --ep consecutive ranks (equal: the same ranks split both ways, as SGLang's --tp N --ep N; on the GPU they must be equal); with --device cuda|cuda-emu and --model glm-5-flash or deepseek-v4-flash, its GPU runner over this many in-process ranks on NCCL (rank r on GPU --gpu+r, or all on --gpu where the driver sees fewer), with --tp too")
	fl.StringVar(&t.dispatch, "ep-dispatch", "gather", "with --ep, or --dp N --dp-attention for the MoE models: the experts' exchange, gather (each rank runs its experts on every token, partial sums reduce-scattered and all-gathered) or all-to-all (each rank sends its share of the tokens to the experts' ranks)")
	fl.BoolVar(&t.procs, "tp-procs", false, "with --tp (or --ep): run ranks 1..N-1 as worker processes of this binary meeting rank 0 in shared memory (default: goroutines of this process); with --device cuda|cuda-emu (llama; deepseek-v4-flash's --tp/--ep layouts) each worker runs on its GPU and its GPU's NUMA node, rank 0 handing it the NCCL id")
	fl.StringVar(&t.initAddr, "dist-init-addr", "", "with --tp, --ep or --dp N --dp-attention: HOST:PORT where rank 0 of a multi-node group listens (SGLang's spelling), the ranks of --tp and --ep (or the dp ranks) split evenly over --nnodes (node k holds ranks k·n ... k·n+n−1, on GPUs --gpu ... --gpu+n−1); node 0 runs the engine, the others serve as workers until it stops. Without it, torchrun's MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE are read when set")
	fl.IntVar(&t.nnodes, "nnodes", 1, "with --dist-init-addr: the number of nodes (processes; each holds ranks/nnodes ranks)")
	fl.IntVar(&t.nodeRank, "node-rank", 0, "with --dist-init-addr: this node's rank; 0 runs the engine")
	fl.BoolVar(&t.stats, "dist-stats", false, "with --model llama --tp 2 or more on the CPU: when the engine stops, print rank 0's prefill and decode steps to stderr with the time spent inside collectives (waiting for the other ranks included) and its share of the steps")
	fl.DurationVar(&t.distTimeout, "dist-timeout", 10*time.Minute, "with --dist-init-addr: how long the rendezvous waits for every node to join before it fails naming the missing ranks (SGLang's --dist-timeout)")
}

// joinTimeout is --dist-timeout, or its default for flags not registered on a command.
func (t *tpFlags) joinTimeout() time.Duration {
	if t.distTimeout <= 0 {
		return 10 * time.Minute
	}
	return t.distTimeout
}

// ranks returns the ranks of the layout: --tp and --ep together run over the larger's
// ranks, the smaller's groups within them (the smaller must divide the larger; the models
// refuse them otherwise).
func (t *tpFlags) ranks() int {
	if t.groupRanks > 1 {
		return t.groupRanks
	}
	if t.size > 1 && t.ep > 1 {
		return max(t.size, t.ep)
	}
	return t.size * t.ep
}

// check validates the flags and, for --tp or --ep above 1 without --dist-init-addr,
// takes a multi-node layout from the environment (LeaderWorkerSet's, then torchrun's).
func (t *tpFlags) check() error {
	switch {
	case t.size < 1:
		return fmt.Errorf("--tp %d: want 1 or more ranks", t.size)
	case t.ep < 1:
		return fmt.Errorf("--ep %d: want 1 or more ranks", t.ep)
	case t.procs && t.size < 2 && t.ep < 2:
		return errors.New("--tp-procs needs --tp 2 or more (or --ep 2 or more)")
	case t.stats && (t.size < 2 || t.ep > 1):
		return fmt.Errorf("--dist-stats times llama's tensor-parallel ranks: it needs --tp 2 or more without --ep (got --tp %d --ep %d)", t.size, t.ep)
	case t.distTimeout <= 0:
		return fmt.Errorf("--dist-timeout %v: want a positive duration", t.distTimeout)
	}
	if t.initAddr == "" && (t.size > 1 || t.ep > 1 || t.groupRanks > 1) {
		// Kubernetes LeaderWorkerSet's LWS_* variables, else torchrun's.
		n, ok, err := launch.NodeFromEnv(os.Getenv)
		if err != nil {
			return err
		}
		if ok {
			t.initAddr, t.nnodes, t.nodeRank, t.localRank = n.InitAddr, n.NNodes, n.NodeRank, n.LocalRank
		}
	}
	if t.initAddr == "" {
		if t.nnodes != 1 || t.nodeRank != 0 {
			return errors.New("--nnodes and --node-rank need --dist-init-addr HOST:PORT")
		}
		return nil
	}
	switch {
	case t.procs:
		return errors.New("--tp-procs and --dist-init-addr are exclusive: a node's ranks are goroutines of its process")
	case t.nnodes < 1:
		return fmt.Errorf("--nnodes %d: want 1 or more nodes", t.nnodes)
	case t.ranks()%t.nnodes != 0 && t.groupRanks > 1:
		return fmt.Errorf("%s over --nnodes %d: the %d ranks must split evenly over the nodes", t.groupFlag, t.nnodes, t.ranks())
	case t.ranks()%t.nnodes != 0:
		return fmt.Errorf("%s over --nnodes %d: the %d ranks must split evenly over the nodes", layoutSpelling(t.size, t.ep, 1), t.nnodes, t.ranks())
	case t.nodeRank < 0 || t.nodeRank >= t.nnodes:
		return fmt.Errorf("--node-rank %d outside [0, %d)", t.nodeRank, t.nnodes)
	}
	return nil
}

// nodeRanks is this node's share of a multi-node group's ranks: the ranks (--tp, --ep)
// split evenly over --nnodes, node k holding ranks [k·n, (k+1)·n), as SGLang places a
// node's tp ranks. The first runs on this goroutine (on node 0 it is rank 0, the
// engine's); the others, on goroutines of this process (withLocalRanks), join the group
// over the same rendezvous as ranks of their own, each on its own GPU when there are GPUs.
func (t *tpFlags) nodeRanks() (first, n int) {
	n = t.ranks() / t.nnodes
	return t.nodeRank * n, n
}

// withLocalRanks runs follow for ranks first+1 ... first+n−1 on goroutines and returns
// wait, which returns once they have all ended, with their errors naming their ranks.
func withLocalRanks(first, n int, follow func(rank int) error) (wait func() error) {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 1; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := follow(first + i); err != nil {
				errs[i] = fmt.Errorf("rank %d: %w", first+i, err)
			}
		}()
	}
	return func() error {
		wg.Wait()
		return errors.Join(errs...)
	}
}

// tpRunner is rank 0's runner of a tensor-parallel group: the engine's runner, whose
// StopRanks (core/cli calls it when the engine stops) ends the other ranks.
type tpRunner struct {
	*cpurunner.Runner
	close func() error
	// workers, when the ranks are worker processes, is their supervisor: Health reports
	// one that exited (serve's /health), where only the next request's step found it.
	workers *launch.Workers
}

func (r *tpRunner) StopRanks() error { return r.close() }

// promptCheck returns what model name refuses of a prompt, nil for nothing: glm-5-flash's
// image and video placeholder tokens (its config in dir), which its text model has no
// vision tower for. The runtime's engines ask it (cli.Runtime.CheckPrompt) where the
// model's runner is wrapped (tpRunner) or each dp rank runs an engine of its own.
func promptCheck(name, dir string) func([]int32) error {
	if name != glm5flash.Name {
		return nil
	}
	c, err := glm5flash.LoadTextConfig(dir)
	if err != nil {
		return nil
	}
	return c.RefuseVisionTokens
}

// Health is the first worker process that exited, or nil (also when no rank is a process).
func (r *tpRunner) Health() error {
	if r.workers == nil {
		return nil
	}
	return r.workers.Err()
}

// Died implements engine.RunnerDeath: closed when a worker process exits (nil without
// workers: never).
func (r *tpRunner) Died() <-chan struct{} { return r.workers.Exited() }

// openTP opens the llama checkpoint (or random-weights config) in dir with tensor
// parallelism over size ranks (core/dist/tp): rank 0's forward serves the engine and
// broadcasts each plan to the others, which are goroutines of this process, or, with
// procs, worker processes of this binary meeting rank 0 in shared memory. The engine's
// pool keeps llama's cache groups, whose page ids the ranks' own caches follow.
func openTP(dir string, cacheBytes int64, f *tpFlags) (engine.Runner, *kvslab.Pool, error) {
	size, procs := f.size, f.procs
	r, err := openLlamaTP(dir)
	if err != nil {
		return nil, nil, err
	}
	pool, err := r.NewPool(cacheBytes)
	if err != nil {
		return nil, nil, err
	}
	pages, pt := tp.CachePages(r.d, pool), pool.BlockTokens()
	if f.initAddr != "" {
		return openTPNodes(r, pool, f)
	}
	if !procs {
		shards, err := r.shards(size)
		if err != nil {
			return nil, nil, fmt.Errorf("--tp %d: %w", size, err)
		}
		g, data, err := tp.StartShardsTimed(shards, pages, pt, dist.Options{Timeout: time.Minute})
		if err != nil {
			return nil, nil, fmt.Errorf("--tp %d: %w", size, err)
		}
		forward, stop := f.timed(g.Forward, g.Close, data)
		return &tpRunner{cpurunner.New(r.Info(), cpurunner.ForwardFunc(forward)), stop, nil}, pool, nil
	}
	s, err := r.shard(0, size)
	if err != nil {
		return nil, nil, fmt.Errorf("--tp %d: %w", size, err)
	}
	g, err := startWorkers(tpWorkerSpec{Name: fmt.Sprintf("resin%d", os.Getpid()), Size: size, Dir: dir, Pages: pages, PageTokens: pt})
	if err != nil {
		return nil, nil, fmt.Errorf("--tp %d: %w", size, err)
	}
	ctl, data := dist.NewTimed(g.ctl), dist.NewTimed(g.data)
	forward, stop := f.timed(g.forward(tp.Lead(ctl, data, s, s.NewCache(pages, pt))), g.close, ctl, data)
	return &tpRunner{cpurunner.New(r.Info(), cpurunner.ForwardFunc(forward)), stop, g.w}, pool, nil
}

// timed returns forward and stop as they are without --dist-stats; with it, forward
// counted into a lockstep.Stats over comms (rank 0's communicators) and a stop that
// prints the figures to stderr once the other ranks stopped.
func (t *tpFlags) timed(forward lockstep.Forward, stop func() error, comms ...*dist.Timed) (lockstep.Forward, func() error) {
	if !t.stats {
		return forward, stop
	}
	var st lockstep.Stats
	return st.Wrap(forward, comms...), func() error {
		err := stop()
		w := t.statsOut
		if w == nil {
			w = os.Stderr
		}
		st.Print(w, fmt.Sprintf("resin: --tp %d rank 0", t.size))
		return err
	}
}

// errWorkerDone ends a worker node's command once its rank has followed rank 0 to the
// end; main exits 0 on it.
var errWorkerDone = errors.New("tp worker: rank 0 stopped the group")

// openTPNodes joins the multi-node group at f.initAddr over TCP (a control group that
// waits as long as the engine idles, then a data group). Node 0 returns the engine's
// runner; the others run their rank until node 0 stops and then end the process.
func openTPNodes(r *llamaTPModel, pool *kvslab.Pool, f *tpFlags) (engine.Runner, *kvslab.Pool, error) {
	join := func(rank int) (s *tp.Shard, ctl, data dist.Communicator, err error) {
		if s, err = r.shard(rank, f.size); err != nil {
			return nil, nil, nil, fmt.Errorf("--tp %d: %w", f.size, err)
		}
		if ctl, err = dist.JoinTCP(f.initAddr, rank, f.size, dist.Options{Timeout: 100 * 365 * 24 * time.Hour, JoinTimeout: f.joinTimeout(), Group: "tp-ctl"}); err != nil {
			return nil, nil, nil, err
		}
		if data, err = dist.JoinTCP(f.initAddr, rank, f.size, dist.Options{Timeout: time.Minute, JoinTimeout: f.joinTimeout(), Group: "tp-data"}); err != nil {
			ctl.Close()
			return nil, nil, nil, err
		}
		return s, ctl, data, nil
	}
	follow := func(rank int) error {
		s, ctl, data, err := join(rank)
		if err != nil {
			return err
		}
		defer ctl.Close()
		defer data.Close()
		return tp.Follow(ctl, data, s, s.NewCache(tp.CachePages(r.d, pool), pool.BlockTokens()))
	}
	first, n := f.nodeRanks()
	wait := withLocalRanks(first, n, follow)
	if first != 0 {
		// A worker node's work ends with rank 0's stop. Returning (not exiting here) lets
		// the callers' defers run: openModel removes its --random-weights directory.
		// A failed rank returns at once (the process ends; its goroutine ranks with it).
		if err := follow(first); err != nil {
			return nil, nil, fmt.Errorf("tp worker: rank %d: %w", first, err)
		}
		if err := wait(); err != nil {
			return nil, nil, fmt.Errorf("tp worker: %w", err)
		}
		return nil, nil, errWorkerDone
	}
	s, ctl, data, err := join(0)
	if err != nil {
		return nil, nil, err
	}
	kv := s.NewCache(tp.CachePages(r.d, pool), pool.BlockTokens())
	stop := func() error {
		err := tp.Stop(ctl)
		ctl.Close()
		data.Close()
		return errors.Join(err, wait())
	}
	tctl, tdata := dist.NewTimed(ctl), dist.NewTimed(data)
	forward, stop := f.timed(tp.Lead(tctl, tdata, s, kv), stop, tctl, tdata)
	return &tpRunner{cpurunner.New(r.Info(), cpurunner.ForwardFunc(forward)), stop, nil}, pool, nil
}

// tpWorkerSpec is what a worker process reads from RESIN_TP_WORKER.
type tpWorkerSpec struct {
	Name       string // the shared-memory groups' name
	Rank, Size int
	Dir        string // the model directory rank 0 opened
	Pages      int    // cache capacity in pages, as rank 0's
	PageTokens int
	// A MoE model's layout (moe_parallel.go); Model empty: llama's TP.
	Model            string
	TP, EP, Dispatch int
	Drafts           int // MTP drafts per step, every rank drafting (0: none)
	CacheBytes       int64
	// CP above 1: a --cp-procs worker of llama's prefill CP (cp.go; with GPU, its GPU
	// CP's, tpgpu.go).
	CP int
	// DPAttention: a --dp-procs worker, dp rank Rank of Size of a MoE model's
	// DP-attention (dp_procs.go).
	DPAttention bool
	// GPU set: a worker of llama's GPU TP or CP (tpgpu.go), or with Model of a MoE
	// model's GPU layout (gpu_layout_procs.go).
	GPU *gpuWorkerSpec `json:",omitempty"`
}

// joinTP joins the control and data groups of spec (the control one waits as long as the
// engine idles; both detect a dead peer at once).
func joinTP(spec tpWorkerSpec, cancel <-chan struct{}) (ctl, data dist.Communicator, err error) {
	o := dist.Options{Timeout: 100 * 365 * 24 * time.Hour, JoinTimeout: 10 * time.Minute, Cancel: cancel}
	if ctl, err = dist.JoinShm(spec.Name+"-ctl", spec.Rank, spec.Size, o); err != nil {
		return nil, nil, err
	}
	o.Timeout = tpDataTimeout
	if data, err = dist.JoinShm(spec.Name+"-data", spec.Rank, spec.Size, o); err != nil {
		ctl.Close()
		return nil, nil, err
	}
	return ctl, data, nil
}

// tpDataTimeout bounds each collective of a worker group's data communicator (a var for
// the tests).
var tpDataTimeout = time.Minute

type tpWorkers struct {
	ctl, data dist.Communicator
	w         *launch.Workers
	wait      func() error // a node's other ranks, on goroutines (joinCPNodes); nil: none
}

// startWorkers starts ranks 1..Size-1 as children of this binary (core/dist/launch:
// each bound to a NUMA node of this host, dying with this process) and joins them as
// rank 0. A worker that exits before joining ends the wait; on any failure every child
// is killed and reaped.
func startWorkers(spec tpWorkerSpec) (*tpWorkers, error) {
	w, err := launchWorkers(spec)
	if err != nil {
		return nil, err
	}
	g := &tpWorkers{w: w}
	if g.ctl, g.data, err = joinTP(spec, w.Exited()); err != nil {
		w.Kill()
		return nil, w.StepError(err)
	}
	return g, nil
}

// launchWorkers starts ranks 1..Size-1 of spec as children of this binary, each reading
// its spec (its Rank set) from RESIN_TP_WORKER, bound to a NUMA node where the topology
// is known.
func launchWorkers(spec tpWorkerSpec) (*launch.Workers, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	binds := cpuBindings(spec.Size)
	var specs []launch.Spec
	for rank := 1; rank < spec.Size; rank++ {
		s := spec
		s.Rank = rank
		b, _ := json.Marshal(s)
		ls := launch.Spec{Rank: rank, Path: exe, Env: []string{"RESIN_TP_WORKER=" + string(b)}, Stdout: io.Discard, Stderr: os.Stderr}
		if binds != nil {
			ls.Binding = &binds[rank]
		}
		specs = append(specs, ls)
	}
	return launch.Start(specs)
}

// cpuBindings plans the NUMA node of each of n CPU ranks on this host (round-robin over
// the nodes, as SGLang's CPU backend binds its TP ranks); nil when the topology cannot
// be read (the workers then run unbound). Rank 0, this process, is not bound.
func cpuBindings(n int) []launch.Binding {
	top, err := cudart.ReadTopology("")
	if err != nil {
		return nil
	}
	top.GPUs = nil // --tp-procs ranks run on the CPU
	allowed, _ := cudart.ProcessAffinity()
	bs, err := launch.PlanBindings(top, n, nil, allowed)
	if err != nil {
		return nil
	}
	return bs
}

// forward is rank 0's forward with a dead worker's exit (rank, pid, signal) on the
// error of the step it failed.
func (g *tpWorkers) forward(f func(*engine.BatchPlan, []float32) error) func(*engine.BatchPlan, []float32) error {
	return func(p *engine.BatchPlan, logits []float32) error {
		if err := g.w.Err(); err != nil {
			// A worker exited while the group idled: the step would meet its peers'
			// collectives short of a rank (shape errors, not the cause), so it fails here.
			return fmt.Errorf("the group lost a worker before step %d: %w", p.Step, err)
		}
		return g.w.StepError(f(p, logits))
	}
}

// close stops the workers and waits for them (killing any still running after a while).
// A worker alive but not running (stopped, wedged) never takes the stop, whose wait on
// the control group has no deadline (it waits as long as the engine idles): past
// stopLimit the workers are killed, which ends that wait.
func (g *tpWorkers) close() error {
	t := time.AfterFunc(stopLimit, g.w.Kill)
	err := tp.Stop(g.ctl)
	if !t.Stop() {
		err = fmt.Errorf("the workers did not take the stop within %v and were killed: %w", stopLimit, err)
	}
	err = errors.Join(err, g.w.Stop(30*time.Second))
	g.ctl.Close()
	g.data.Close()
	if g.wait != nil {
		err = errors.Join(err, g.wait())
	}
	return err
}

func (g *tpWorkers) kill() { g.w.Kill() }

// tpWorkerFromEnv runs this process as a TP worker when RESIN_TP_WORKER is set (a child
// startWorkers started) and exits; otherwise it returns.
func tpWorkerFromEnv() {
	raw := os.Getenv("RESIN_TP_WORKER")
	if raw == "" {
		return
	}
	role := "tp worker"
	var spec tpWorkerSpec
	if json.Unmarshal([]byte(raw), &spec) == nil {
		role = spec.role()
	}
	if _, err := launch.ApplyEnv(); err != nil {
		fmt.Fprintf(os.Stderr, "resin: %s: running unbound: %v\n", role, err) // slower, still correct
	}
	if err := runTPWorker(raw); err != nil {
		fmt.Fprintf(os.Stderr, "resin: %s: %v\n", role, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// role names the worker in its log lines by its layout's flag: a --dp-procs worker is a
// "dp worker", a --cp-procs one a "cp worker", the others (--tp-procs) "tp worker".
func (s tpWorkerSpec) role() string {
	switch {
	case s.DPAttention:
		return "dp worker"
	case s.CP > 1:
		return "cp worker"
	}
	return "tp worker"
}

func runTPWorker(raw string) error {
	var spec tpWorkerSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		return fmt.Errorf("RESIN_TP_WORKER: %w", err)
	}
	if spec.DPAttention {
		return runDPWorker(spec)
	}
	if spec.GPU != nil && spec.Model != "" {
		return runGPULayoutWorker(spec)
	}
	if spec.GPU != nil {
		return runGPUTPWorker(spec) // llama's GPU TP or CP
	}
	if spec.CP > 1 {
		return runCPWorker(spec)
	}
	if spec.Model != "" {
		return runMoEWorker(spec)
	}
	r, err := openLlamaTP(spec.Dir)
	if err != nil {
		return fmt.Errorf("rank %d: %w", spec.Rank, err)
	}
	s, err := r.shard(spec.Rank, spec.Size)
	if err != nil {
		return err
	}
	ctl, data, err := joinTP(spec, nil)
	if err != nil {
		return err
	}
	defer ctl.Close()
	defer data.Close()
	return tp.Follow(ctl, data, s, s.NewCache(spec.Pages, spec.PageTokens))
}
