//go:build unix

package dist

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The shared-memory tests run each rank as a child of the test binary (TestShmWorker with
// RESIN_DIST_* set), so the ranks are real processes meeting in a real mmap'ed file.

func shmName(t *testing.T) string {
	return fmt.Sprintf("test%d-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "_"))
}

// child is a child of the test binary running test with env added.
func child(ctx context.Context, test string, env ...string) *osexec.Cmd {
	cmd := osexec.CommandContext(ctx, os.Args[0], "-test.run=^"+test+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), env...)
	return cmd
}

// spawn starts rank of a group of size meeting at name, doing mode in TestShmWorker.
func spawn(ctx context.Context, name string, rank, size int, mode string) (*osexec.Cmd, *bytes.Buffer, error) {
	cmd := osexec.CommandContext(ctx, os.Args[0], "-test.run=^TestShmWorker$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "RESIN_DIST_NAME="+name, "RESIN_DIST_RANK="+strconv.Itoa(rank),
		"RESIN_DIST_SIZE="+strconv.Itoa(size), "RESIN_DIST_MODE="+mode)
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	return cmd, out, cmd.Start()
}

// TestShmWorker is one rank of a shared-memory test when RESIN_DIST_NAME is set.
func TestShmWorker(t *testing.T) {
	name := os.Getenv("RESIN_DIST_NAME")
	if name == "" {
		t.Skip("a rank of the shared-memory tests; runs only as their child")
	}
	rank, _ := strconv.Atoi(os.Getenv("RESIN_DIST_RANK"))
	size, _ := strconv.Atoi(os.Getenv("RESIN_DIST_SIZE"))
	c, err := JoinShm(name, rank, size, Options{Timeout: 20 * time.Second, SlotBytes: 256})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	switch os.Getenv("RESIN_DIST_MODE") {
	case "exercise":
		d, err := exercise(c)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("DIGEST %d %s\n", rank, hex.EncodeToString(d))
	case "hang": // joined, then stuck until killed
		time.Sleep(time.Minute)
	case "exit": // joined, then gone before the first collective
		os.Exit(3)
	}
}

// TestShmCollectives: 3 processes run every collective (slots of 256 bytes, so the
// 3000-byte broadcast takes 12 rounds) against the serial reference, twice, with the same
// digests both times.
func TestShmCollectives(t *testing.T) {
	const n = 3
	var first []string
	for run := range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		name := fmt.Sprintf("%s-%d", shmName(t), run)
		var cmds []*osexec.Cmd
		var outs []*bytes.Buffer
		for r := range n {
			cmd, out, err := spawn(ctx, name, r, n, "exercise")
			if err != nil {
				t.Fatal(err)
			}
			cmds, outs = append(cmds, cmd), append(outs, out)
		}
		var digests []string
		for r, cmd := range cmds {
			if err := cmd.Wait(); err != nil {
				t.Fatalf("run %d rank %d: %v\n%s", run, r, err, outs[r])
			}
			i := strings.Index(outs[r].String(), fmt.Sprintf("DIGEST %d ", r))
			if i < 0 {
				t.Fatalf("rank %d printed no digest:\n%s", r, outs[r])
			}
			digests = append(digests, strings.Fields(outs[r].String()[i:])[2])
		}
		if run == 1 && strings.Join(digests, ",") != strings.Join(first, ",") {
			t.Fatalf("the second run's results differ: %v vs %v", digests, first)
		}
		first = digests
		if _, err := os.Stat(filepath.Join(ShmDir(), "resin-dist-"+name)); !os.IsNotExist(err) {
			t.Fatalf("the shared file outlived the join: %v", err)
		}
	}
}

// TestShmNeverJoins: rank 0 waiting for a rank that never starts, and a rank waiting for
// a rank 0 that never creates the file, fail within the deadline naming the missing rank.
func TestShmNeverJoins(t *testing.T) {
	name := shmName(t)
	_, err := JoinShm(name, 0, 2, Options{Timeout: 300 * time.Millisecond})
	var pe *PeerError
	if !errors.As(err, &pe) || pe.Peer != 1 || !errors.Is(err, ErrTimeout) {
		t.Fatalf("rank 0 alone: %v, want a timeout naming rank 1", err)
	}
	if _, err := os.Stat(filepath.Join(ShmDir(), "resin-dist-"+name)); !os.IsNotExist(err) {
		t.Fatalf("a failed join left its file: %v", err)
	}
	_, err = JoinShm(name+"x", 1, 2, Options{Timeout: 300 * time.Millisecond})
	if !errors.As(err, &pe) || pe.Peer != 0 || !errors.Is(err, ErrTimeout) {
		t.Fatalf("rank 1 alone: %v, want a timeout naming rank 0", err)
	}
	if _, err := JoinShm("a/b", 0, 2, Options{}); err == nil {
		t.Fatal("a name with '/' accepted")
	}
}

// TestShmDeadPeer: a peer killed after joining (SIGKILL, mid-run) or one that exits
// fails the collective of rank 0 (this process) with ErrPeerGone naming it, well before
// the deadline, and the child is reaped (no orphan).
func TestShmDeadPeer(t *testing.T) {
	for _, mode := range []string{"hang", "exit"} {
		t.Run(mode, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			name := shmName(t)
			cmd, out, err := spawn(ctx, name, 1, 2, mode)
			if err != nil {
				t.Fatal(err)
			}
			defer cmd.Wait()
			c, err := JoinShm(name, 0, 2, Options{Timeout: 50 * time.Second})
			if err != nil {
				cmd.Process.Kill()
				t.Fatalf("%v\n%s", err, out)
			}
			defer c.Close()
			if mode == "hang" {
				cmd.Process.Kill()
			}
			err = AllReduceF32(c, make([]float32, 8))
			var pe *PeerError
			if !errors.As(err, &pe) || pe.Peer != 1 || !errors.Is(err, ErrPeerGone) {
				t.Fatalf("%v, want rank 1 gone", err)
			}
		})
	}
}

// TestShmJoinCanceled: closing Options.Cancel ends rank 0's wait for a rank that will
// never join, before the deadline.
func TestShmJoinCanceled(t *testing.T) {
	cancel := make(chan struct{})
	close(cancel)
	_, err := JoinShm(shmName(t), 0, 2, Options{Timeout: time.Hour, Cancel: cancel})
	var pe *PeerError
	if !errors.As(err, &pe) || pe.Peer != 1 || !errors.Is(err, ErrCanceled) {
		t.Fatalf("%v, want rank 1's join canceled", err)
	}
}

// TestShmAnyRankGone: rank 0 waits on rank 1, alive but not in the collective (it waits
// elsewhere, as a TP peer of a dead rank does), while rank 2 closes its communicator:
// rank 0 fails at once naming rank 2 gone, not rank 1 at the deadline (20 s here), since
// no exchange of the three can finish without rank 2.
func TestShmAnyRankGone(t *testing.T) {
	name := shmName(t)
	comms := make([]Communicator, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for r := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			comms[r], errs[r] = JoinShm(name, r, 3, Options{Timeout: 20 * time.Second})
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		defer comms[r].Close()
	}
	comms[2].Close()
	err := AllReduceF32(comms[0], make([]float32, 8))
	var pe *PeerError
	if !errors.As(err, &pe) || pe.Peer != 2 || !errors.Is(err, ErrPeerGone) {
		t.Fatalf("%v, want rank 2 gone", err)
	}
}
