//go:build unix

package dist

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// freeAddr returns a loopback address with a port nothing listens on (just now).
func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// joinAllTCP joins n ranks at addr from goroutines of this process.
func joinAllTCP(t *testing.T, addr string, n int) []Communicator {
	cs := make([]Communicator, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cs[r], errs[r] = JoinTCP(addr, r, n, Options{Timeout: 20 * time.Second})
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return cs
}

// TestTCPCollectives: 1 to 4 ranks meeting over loopback TCP run every collective (the
// split's subgroups meeting at their new rank 0's port) against the serial reference,
// with the in-process ranks' digests: the same bits whatever the transport.
func TestTCPCollectives(t *testing.T) {
	for n := 1; n <= 4; n++ {
		cs := joinAllTCP(t, freeAddr(t), n)
		got, errs := runAll(cs, exercise)
		ref, _ := NewInProcess(n, Options{Timeout: 10 * time.Second})
		want, _ := runAll(ref, exercise)
		for r := range n {
			if errs[r] != nil {
				t.Fatalf("%d ranks, rank %d: %v", n, r, errs[r])
			}
			if hex.EncodeToString(got[r]) != hex.EncodeToString(want[r]) {
				t.Fatalf("%d ranks, rank %d: the tcp results differ from the in-process ones", n, r)
			}
			cs[r].Close()
		}
	}
}

// TestTCPWorker is one rank of a TCP test when RESIN_DIST_TCP is set.
func TestTCPWorker(t *testing.T) {
	addr := os.Getenv("RESIN_DIST_TCP")
	if addr == "" {
		t.Skip("a rank of the TCP tests; runs only as their child")
	}
	rank, _ := strconv.Atoi(os.Getenv("RESIN_DIST_RANK"))
	size, _ := strconv.Atoi(os.Getenv("RESIN_DIST_SIZE"))
	c, err := JoinTCP(addr, rank, size, Options{Timeout: 20 * time.Second})
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
	case "hang":
		time.Sleep(time.Minute)
	}
}

// TestTCPFaults: the rendezvous port in use, a rank that never joins, rank 0 never
// listening, a duplicate rank, and a peer killed after joining (SIGKILL, a real child
// process): each a clear error naming the rank, within the deadline, the child reaped.
func TestTCPFaults(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	if _, err := JoinTCP(busy.Addr().String(), 0, 2, Options{}); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("port in use: %v", err)
	}
	quick := Options{Timeout: 300 * time.Millisecond}
	var pe *PeerError
	if _, err := JoinTCP(freeAddr(t), 0, 2, quick); !errors.As(err, &pe) || pe.Peer != 1 || !errors.Is(err, ErrTimeout) {
		t.Fatalf("rank 0 alone: %v, want a timeout naming rank 1", err)
	}
	if _, err := JoinTCP(freeAddr(t), 1, 2, quick); !errors.As(err, &pe) || pe.Peer != 0 || !errors.Is(err, ErrTimeout) {
		t.Fatalf("rank 1 alone: %v, want a timeout naming rank 0", err)
	}

	// A duplicate rank 1 is refused; the group still forms with the first.
	addr := freeAddr(t)
	var wg sync.WaitGroup
	var c0, c1 Communicator
	var e0, e1 error
	admitted := make(chan int, 3)
	testHookJoined = func(rank int) { admitted <- rank }
	defer func() { testHookJoined = nil }()
	wg.Add(2)
	go func() { defer wg.Done(); c0, e0 = JoinTCP(addr, 0, 3, Options{Timeout: 10 * time.Second}) }()
	go func() { defer wg.Done(); c1, e1 = JoinTCP(addr, 1, 3, Options{Timeout: 10 * time.Second}) }()
	// The duplicate must come after rank 0 admitted the first rank 1 (a sleep let it race
	// ahead on a loaded machine).
	select {
	case <-admitted:
	case <-time.After(10 * time.Second):
		t.Fatal("rank 0 never admitted rank 1")
	}
	if _, err := JoinTCP(addr, 1, 3, Options{Timeout: 10 * time.Second}); err == nil || !strings.Contains(err.Error(), "already joined") {
		t.Fatalf("a second rank 1: %v", err)
	}

	// Rank 2 a child process, killed after joining: rank 0 and rank 1 both name it.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := child(ctx, "TestTCPWorker", "RESIN_DIST_TCP="+addr, "RESIN_DIST_RANK=2", "RESIN_DIST_SIZE=3", "RESIN_DIST_MODE=hang")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	wg.Wait()
	if e0 != nil || e1 != nil {
		cmd.Process.Kill()
		t.Fatalf("join: %v, %v", e0, e1)
	}
	cmd.Process.Kill()
	_, errs := runAll([]Communicator{c0, c1}, func(c Communicator) ([]byte, error) { return nil, AllReduceF32(c, make([]float32, 4)) })
	for r, err := range errs {
		if !errors.As(err, &pe) || pe.Peer != 2 || !errors.Is(err, ErrPeerGone) {
			t.Fatalf("rank %d: %v, want rank 2 gone", r, err)
		}
	}
}

// TestTCPGroupsShareAddress: two groups formed one after the other at one address (a
// control and a data group, as resin's multi-node TP does) both form, however the ranks
// race: a rank dialing while the first group's rank 0 still listens is turned away and
// dials again.
func TestTCPGroupsShareAddress(t *testing.T) {
	for range 5 {
		addr := freeAddr(t)
		const n = 3
		errs := make([]error, n)
		var wg sync.WaitGroup
		for r := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for _, name := range []string{"ctl", "data"} {
					c, err := JoinTCP(addr, r, n, Options{Timeout: 10 * time.Second, Group: name})
					if err != nil {
						errs[r] = fmt.Errorf("%s: %w", name, err)
						return
					}
					defer c.Close()
					if err := c.Barrier(); err != nil {
						errs[r] = fmt.Errorf("%s: %w", name, err)
						return
					}
				}
			}()
		}
		wg.Wait()
		for r, err := range errs {
			if err != nil {
				t.Fatalf("rank %d: %v", r, err)
			}
		}
	}
}

// TestTCPJoinRetriesAResetHello: a rank that dials into a listener which resets the
// connection (rank 0 closing the listener of a group before this one at the same
// address) has its hello's write fail, and dials again until the real rank 0 answers,
// as it does when the answer never comes. The group name is 8 MiB so that the hello
// outlasts the socket buffers and its write, not only the read, meets the reset.
func TestTCPJoinRetriesAResetHello(t *testing.T) {
	addr := freeAddr(t)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	group := strings.Repeat("g", 8<<20)
	joined := make(chan error, 1)
	go func() {
		c, err := JoinTCP(addr, 1, 2, Options{Timeout: 20 * time.Second, Group: group})
		if err == nil {
			err = c.Barrier()
			c.Close()
		}
		joined <- err
	}()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	c.(*net.TCPConn).SetLinger(0) // close with a reset, unread hello and all
	c.Close()
	ln.Close()
	rank0, err := JoinTCP(addr, 0, 2, Options{Timeout: 20 * time.Second, Group: group})
	if err != nil {
		t.Fatal(err)
	}
	defer rank0.Close()
	if err := rank0.Barrier(); err != nil {
		t.Fatal(err)
	}
	if err := <-joined; err != nil {
		t.Fatalf("rank 1: %v", err)
	}
}
