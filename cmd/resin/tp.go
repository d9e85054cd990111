package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/tp"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/models/llama"
)

// tpRunner is rank 0's runner of a tensor-parallel group: the engine's runner, whose
// StopRanks (core/cli calls it when the engine stops) ends the other ranks.
type tpRunner struct {
	*cpurunner.Runner
	close func() error
}

func (r *tpRunner) StopRanks() error { return r.close() }

// openTP opens the llama checkpoint (or random-weights config) in dir with tensor
// parallelism over size ranks (core/dist/tp): rank 0's forward serves the engine and
// broadcasts each plan to the others, which are goroutines of this process, or, with
// procs, worker processes of this binary meeting rank 0 in shared memory. The engine's
// pool keeps llama's cache groups, whose page ids the ranks' own caches follow.
func openTP(dir string, cacheBytes int64, size int, procs bool) (engine.Runner, *kvslab.Pool, error) {
	r, err := llama.Load(dir, llama.Options{})
	if err != nil {
		return nil, nil, err
	}
	pool, err := r.NewPool(cacheBytes)
	if err != nil {
		return nil, nil, err
	}
	d, w, err := llamaTP(r.Model)
	if err != nil {
		return nil, nil, err
	}
	pages, pt := tp.CachePages(d, pool), pool.BlockTokens()
	if !procs {
		g, err := tp.StartInProcess(d, w, size, pages, pt, dist.Options{Timeout: time.Minute})
		if err != nil {
			return nil, nil, fmt.Errorf("--tp %d: %w", size, err)
		}
		return &tpRunner{cpurunner.New(r.Info(), cpurunner.ForwardFunc(g.Forward)), g.Close}, pool, nil
	}
	s, err := tp.NewShard(d, w, 0, size)
	if err != nil {
		return nil, nil, fmt.Errorf("--tp %d: %w", size, err)
	}
	g, err := startWorkers(tpWorkerSpec{Name: fmt.Sprintf("resin%d", os.Getpid()), Size: size, Dir: dir, Pages: pages, PageTokens: pt})
	if err != nil {
		return nil, nil, fmt.Errorf("--tp %d: %w", size, err)
	}
	forward := tp.Lead(g.ctl, g.data, s, s.NewCache(pages, pt))
	return &tpRunner{cpurunner.New(r.Info(), cpurunner.ForwardFunc(forward)), g.close}, pool, nil
}

// tpWorkerSpec is what a worker process reads from RESIN_TP_WORKER.
type tpWorkerSpec struct {
	Name       string // the shared-memory groups' name
	Rank, Size int
	Dir        string // the model directory rank 0 opened
	Pages      int    // cache capacity in pages, as rank 0's
	PageTokens int
}

// joinTP joins the control and data groups of spec (the control one waits as long as the
// engine idles; both detect a dead peer at once).
func joinTP(spec tpWorkerSpec, cancel <-chan struct{}) (ctl, data dist.Communicator, err error) {
	o := dist.Options{Timeout: 100 * 365 * 24 * time.Hour, JoinTimeout: 10 * time.Minute, Cancel: cancel}
	if ctl, err = dist.JoinShm(spec.Name+"-ctl", spec.Rank, spec.Size, o); err != nil {
		return nil, nil, err
	}
	o.Timeout = time.Minute
	if data, err = dist.JoinShm(spec.Name+"-data", spec.Rank, spec.Size, o); err != nil {
		ctl.Close()
		return nil, nil, err
	}
	return ctl, data, nil
}

type tpWorkers struct {
	ctl, data dist.Communicator
	cmds      []*exec.Cmd
	exited    []chan error
}

// startWorkers starts ranks 1..Size-1 as children of this binary and joins them as rank
// 0. A worker that exits before joining ends the wait; on any failure every child is
// killed and reaped.
func startWorkers(spec tpWorkerSpec) (*tpWorkers, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	g := &tpWorkers{}
	cancel := make(chan struct{})
	var once sync.Once
	for rank := 1; rank < spec.Size; rank++ {
		s := spec
		s.Rank = rank
		b, _ := json.Marshal(s)
		cmd := exec.Command(exe)
		cmd.Env = append(os.Environ(), "RESIN_TP_WORKER="+string(b))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			g.kill()
			return nil, fmt.Errorf("start rank %d: %w", rank, err)
		}
		done := make(chan error, 1)
		go func() {
			done <- cmd.Wait()
			once.Do(func() { close(cancel) })
		}()
		g.cmds, g.exited = append(g.cmds, cmd), append(g.exited, done)
	}
	if g.ctl, g.data, err = joinTP(spec, cancel); err != nil {
		g.kill()
		return nil, err
	}
	return g, nil
}

// close stops the workers and waits for them (killing any still running after a while).
func (g *tpWorkers) close() error {
	err := tp.Stop(g.ctl)
	for i, done := range g.exited {
		select {
		case werr := <-done:
			if werr != nil && err == nil {
				err = fmt.Errorf("tp rank %d: %w", i+1, werr)
			}
		case <-time.After(30 * time.Second):
			g.cmds[i].Process.Kill()
			<-done
			err = errors.Join(err, fmt.Errorf("tp rank %d did not stop; killed", i+1))
		}
	}
	g.ctl.Close()
	g.data.Close()
	return err
}

func (g *tpWorkers) kill() {
	for i, cmd := range g.cmds {
		cmd.Process.Kill()
		<-g.exited[i]
	}
}

// tpWorkerFromEnv runs this process as a TP worker when RESIN_TP_WORKER is set (a child
// startWorkers started) and exits; otherwise it returns.
func tpWorkerFromEnv() {
	raw := os.Getenv("RESIN_TP_WORKER")
	if raw == "" {
		return
	}
	if err := runTPWorker(raw); err != nil {
		fmt.Fprintln(os.Stderr, "resin: tp worker:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func runTPWorker(raw string) error {
	var spec tpWorkerSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		return fmt.Errorf("RESIN_TP_WORKER: %w", err)
	}
	r, err := llama.Load(spec.Dir, llama.Options{})
	if err != nil {
		return fmt.Errorf("rank %d: %w", spec.Rank, err)
	}
	d, w, err := llamaTP(r.Model)
	if err != nil {
		return err
	}
	s, err := tp.NewShard(d, w, spec.Rank, spec.Size)
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

// llamaTP describes a loaded llama model for core/dist/tp.
func llamaTP(m *llama.Model) (tp.Dense, *tp.Weights, error) {
	c := m.Config
	rope, err := c.RopeTable(m.MaxContext())
	if err != nil {
		return tp.Dense{}, nil, err
	}
	d := tp.Dense{Hidden: c.HiddenSize, HeadDim: c.HeadDim, Heads: c.NumAttentionHeads, KVHeads: c.NumKeyValueHeads,
		Inter: c.IntermediateSize, Vocab: c.VocabSize, Layers: c.NumHiddenLayers, Eps: float32(c.RMSNormEps),
		QKNorm: c.QKNorm, Window: c.Window, Rope: rope}
	w := &tp.Weights{Embed: m.W.Embed, Norm: m.W.Norm, Head: m.W.Head}
	for _, l := range m.W.Layers {
		w.Layers = append(w.Layers, tp.Layer{AttnNorm: l.AttnNorm, MLPNorm: l.MLPNorm, Q: l.Q, K: l.K, V: l.V, O: l.O,
			QBias: l.QBias, KBias: l.KBias, VBias: l.VBias, OBias: l.OBias, QNorm: l.QNorm, KNorm: l.KNorm,
			Gate: l.Gate, Up: l.Up, Down: l.Down})
	}
	return d, w, nil
}
