package launch_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/launch"
)

// The supervision tests run ranks 1 and 2 as children of the test binary
// (TestLaunchWorker with RESIN_LAUNCH_NAME set), meeting rank 0 (the test) in shared
// memory: per step rank 0 broadcasts a tick (0 stops), then the ranks all-reduce.

const workers = 2

// TestLaunchWorker is a worker of the supervision tests; it applies its binding and
// prints what it is bound to.
func TestLaunchWorker(t *testing.T) {
	name := os.Getenv("RESIN_LAUNCH_NAME")
	if name == "" {
		t.Skip("a worker of the supervision tests; runs only as their child")
	}
	rank, _ := strconv.Atoi(os.Getenv("RESIN_LAUNCH_RANK"))
	node, err := launch.ApplyEnv()
	if err != nil {
		t.Fatal(err)
	}
	cpus, _ := cudart.ProcessAffinity()
	fmt.Printf("rank %d bound to node %d cpus %s gpu %q\n", rank, node, cudart.FormatCPUList(cpus), os.Getenv("CUDA_VISIBLE_DEVICES"))
	ctl, data, err := join(name, rank)
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	defer data.Close()
	for {
		m, err := ctl.Broadcast(nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		if m[0] == 0 {
			return
		}
		if err := dist.AllReduceF32(data, []float32{float32(rank)}); err != nil {
			t.Fatal(err)
		}
	}
}

func join(name string, rank int) (ctl, data dist.Communicator, err error) {
	o := dist.Options{Timeout: time.Minute, JoinTimeout: time.Minute}
	if ctl, err = dist.JoinShm(name+"-ctl", rank, workers+1, o); err != nil {
		return nil, nil, err
	}
	if data, err = dist.JoinShm(name+"-data", rank, workers+1, o); err != nil {
		ctl.Close()
		return nil, nil, err
	}
	return ctl, data, nil
}

// syncBuffer is a bytes.Buffer the worker's output goroutine and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startGroup starts the workers bound as PlanBindings binds them on this machine, and
// joins them as rank 0.
func startGroup(t *testing.T, name string) (*launch.Workers, dist.Communicator, dist.Communicator, []launch.Binding, []*syncBuffer) {
	top, err := cudart.ReadTopology("")
	if err != nil {
		t.Fatal(err)
	}
	top.GPUs = nil // the CPU ranks' binding, whatever this machine holds
	allowed, _ := cudart.ProcessAffinity()
	binds, err := launch.PlanBindings(top, workers, nil, allowed)
	if err != nil {
		t.Fatal(err)
	}
	var specs []launch.Spec
	outs := make([]*syncBuffer, workers)
	for i := range workers {
		outs[i] = &syncBuffer{}
		specs = append(specs, launch.Spec{Rank: i + 1, Path: os.Args[0], Args: []string{"-test.run=^TestLaunchWorker$", "-test.count=1"},
			Env:     []string{"RESIN_LAUNCH_NAME=" + name, fmt.Sprintf("RESIN_LAUNCH_RANK=%d", i+1)},
			Binding: &binds[i], Stdout: outs[i], Stderr: outs[i]})
	}
	w, err := launch.Start(specs)
	if err != nil {
		t.Fatal(err)
	}
	ctl, data, err := join(name, 0)
	if err != nil {
		w.Kill()
		t.Fatal(err)
	}
	return w, ctl, data, binds, outs
}

// step is rank 0's step: the tick, then the all-reduce, whose sum it checks.
func step(ctl, data dist.Communicator) error {
	if _, err := ctl.Broadcast([]byte{1}, 0); err != nil {
		return err
	}
	x := []float32{0}
	if err := dist.AllReduceF32(data, x); err != nil {
		return err
	}
	if x[0] != 3 {
		return fmt.Errorf("sum %v, want 3", x[0])
	}
	return nil
}

// TestWorkersRunAndStop: the workers run bound (the CPUs and node the plan gave them),
// take part in every step, and stop cleanly on rank 0's stop message.
func TestWorkersRunAndStop(t *testing.T) {
	w, ctl, data, binds, outs := startGroup(t, fmt.Sprintf("launch%d", os.Getpid()))
	defer ctl.Close()
	defer data.Close()
	for i := range 5 {
		if err := step(ctl, data); err != nil {
			w.Kill()
			t.Fatalf("step %d: %v", i, err)
		}
	}
	if _, err := ctl.Broadcast([]byte{0}, 0); err != nil {
		t.Fatal(err)
	}
	if err := w.Stop(time.Minute); err != nil {
		t.Fatalf("stop: %v\n%s\n%s", err, outs[0], outs[1])
	}
	for i, b := range binds {
		want := fmt.Sprintf("rank %d bound to node %d cpus %s", i+1, b.Node, cudart.FormatCPUList(b.CPUs))
		if !strings.Contains(outs[i].String(), want) {
			t.Errorf("worker %d said %q, want %q", i+1, outs[i], want)
		}
	}
}

// TestWorkerKilled: a worker killed (SIGKILL) between steps fails rank 0's next step at
// once with an error naming its rank, pid and signal (the killed one, even when the other
// worker exits first on seeing it gone); Stop ends the other worker and reaps both,
// leaving no process behind.
func TestWorkerKilled(t *testing.T) {
	w, ctl, data, _, outs := startGroup(t, fmt.Sprintf("launchkill%d", os.Getpid()))
	defer ctl.Close()
	defer data.Close()
	var err error
	for i := 0; i < 50 && err == nil; i++ {
		if i == 3 {
			syscall.Kill(w.Pids()[0], syscall.SIGKILL)
		}
		err = step(ctl, data)
	}
	err = w.StepError(err)
	var xe *launch.ExitError
	var pe *dist.PeerError
	if !errors.As(err, &xe) || xe.Rank != 1 || xe.Pid != w.Pids()[0] || !strings.Contains(err.Error(), "signal: killed") {
		t.Fatalf("step error %v, want worker rank 1 killed", err)
	}
	if !errors.As(err, &pe) || pe.Peer != 1 || !errors.Is(err, dist.ErrPeerGone) {
		t.Fatalf("step error %v, want the collective's rank 1 gone", err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Stop(5 * time.Second) }()
	select {
	case err := <-done:
		// The other worker may see rank 1 gone and exit (status 1) before rank 1 is reaped:
		// both exits are reported, rank 1's with its signal.
		if want := fmt.Sprintf("worker rank 1 (pid %d) exited: signal: killed", w.Pids()[0]); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Stop: %v, want %q", err, want)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("Stop hangs")
	}
	for i, pid := range w.Pids() {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("worker %d (pid %d) is still there: %v\n%s", i+1, pid, err, outs[i])
		}
	}
}
