//go:build unix

package dptest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/dp"
)

// Procs is a dp group of one process per rank on this host: rank 0 is the test, ranks
// 1.. are children of the test binary running the model's worker test, all met in shared
// memory (dp.JoinShm).
type Procs struct {
	Ctl  []dist.Communicator // rank 0's control pairs, ctl[0] nil
	Data dist.Communicator   // rank 0's data group (the expert exchanges)
	Cmds []*exec.Cmd         // the children, rank r at r-1
	outs []*bytes.Buffer
	stop context.CancelFunc
}

var groups atomic.Int64

// Env names of what a worker child reads (WorkerEnv).
const (
	envRank = "RESIN_DPTEST_RANK"
	envName = "RESIN_DPTEST_NAME"
	envSize = "RESIN_DPTEST_SIZE"
)

// StartProcs starts ranks 1..size-1 as children running the test named worker (with env
// added to their environment) and joins them as rank 0. The children get 3 minutes in
// all; Stop ends and reaps them.
func StartProcs(t testing.TB, size int, worker string, env ...string) *Procs {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	name := fmt.Sprintf("dptest-%d-%d", os.Getpid(), groups.Add(1))
	p := &Procs{stop: cancel}
	for rank := 1; rank < size; rank++ {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+worker+"$", "-test.count=1", "-test.v")
		cmd.Env = append(append(os.Environ(), env...), envRank+"="+strconv.Itoa(rank), envName+"="+name, envSize+"="+strconv.Itoa(size))
		out := &bytes.Buffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			p.Stop(t, true)
			t.Fatal(err)
		}
		p.Cmds, p.outs = append(p.Cmds, cmd), append(p.outs, out)
	}
	var err error
	var hello dist.Communicator
	p.Ctl, p.Data, hello, err = dp.JoinShm(name, 0, size, dist.Options{Timeout: 20 * time.Second, JoinTimeout: time.Minute})
	if err != nil {
		p.Stop(t, true)
		t.Fatal(err)
	}
	hello.Close()
	return p
}

// WorkerEnv is what a worker test reads: its rank, the group's name and size; ok false
// when the test does not run as a StartProcs child.
func WorkerEnv() (rank int, name string, size int, ok bool) {
	rank, err := strconv.Atoi(os.Getenv(envRank))
	if err != nil {
		return 0, "", 0, false
	}
	size, err = strconv.Atoi(os.Getenv(envSize))
	return rank, os.Getenv(envName), size, err == nil
}

// Stop tells the workers to stop (dp.StopRemote), closes rank 0's communicators and
// reaps every child, failing t when one does not exit within 30 s (an orphan) or, unless
// faulty (a child meant to die, or the group broken by one), exits with an error.
func (p *Procs) Stop(t testing.TB, faulty bool) {
	t.Helper()
	defer p.stop()
	if err := dp.StopRemote(p.Ctl); err != nil && !faulty {
		t.Error(err)
	}
	if p.Data != nil {
		p.Data.Close()
	}
	for i, c := range p.Cmds {
		done := make(chan error, 1)
		go func() { done <- c.Wait() }()
		select {
		case err := <-done:
			switch {
			case err != nil && !faulty:
				t.Errorf("dp rank %d's worker: %v\n%s", i+1, err, p.outs[i])
			case faulty:
				t.Logf("dp rank %d's worker exited: %v\n%s", i+1, err, p.outs[i])
			}
		case <-time.After(30 * time.Second):
			c.Process.Kill()
			<-done
			t.Errorf("dp rank %d's worker (pid %d) did not exit within 30 s of the stop: killed\n%s", i+1, c.Process.Pid, p.outs[i])
		}
	}
}
