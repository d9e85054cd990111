package dist

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/cudart/emutest"
)

// TestEmulatedNCCL runs every collective of the NCCL communicator on three emulated GPUs
// (RESIN_EMU_DEVICES=3, one rank per device thread, as core/cudart's TestEmulatedNCCLRanks)
// against the serial reference, twice with the same bits; the split makes a two-rank and
// a one-rank NCCL group.
func TestEmulatedNCCL(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=3") {
		return
	}
	const n = 3
	devs := openDevices(t, n)
	var first [][]byte
	for run := range 2 {
		cs := joinNCCL(t, devs, Options{Timeout: 30 * time.Second})
		digests, rerrs := runAll(cs, exercise)
		for r, err := range rerrs {
			if err != nil {
				t.Fatalf("run %d rank %d: %v", run, r, err)
			}
		}
		if run == 1 {
			for r := range digests {
				if !bytes.Equal(digests[r], first[r]) {
					t.Fatalf("rank %d: the second run differs", r)
				}
			}
		}
		first = digests
		for _, c := range cs {
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// collectives runs the collectives the emulated NCCL covers across processes (all-reduce
// in f32 and bf16, all-gather-v, reduce-scatter-v, broadcast, and all-to-all-v, made of
// grouped sends and receives) and returns a digest of their results. The 5000-element
// all-reduce spans several of the shared-memory chunks the test makes small.
func collectives(c Communicator) ([]byte, error) {
	n, me := c.Size(), c.Rank()
	h := sha256.New()
	x := make([]float32, 5000)
	for i := range x {
		x[i] = in(me, i)
	}
	if err := AllReduceF32(c, x); err != nil {
		return nil, err
	}
	for i, v := range x {
		want := in(0, i)
		for q := 1; q < n; q++ {
			want += in(q, i)
		}
		if v != want {
			return nil, fmt.Errorf("all-reduce f32 [%d] = %g, want %g", i, v, want)
		}
	}
	h.Write(F32Bytes(x))
	xb := make([]uint16, 3001)
	for i := range xb {
		xb[i] = toBF16(in(me, i) * 3)
	}
	if err := c.AllReduce(BF16Bytes(xb), BF16); err != nil {
		return nil, err
	}
	h.Write(BF16Bytes(xb))
	got, err := c.AllGatherV(bytes.Repeat([]byte{byte(me + 1)}, 700*(me+1)))
	if err != nil {
		return nil, err
	}
	for q := range n {
		if !bytes.Equal(got[q], bytes.Repeat([]byte{byte(q + 1)}, 700*(q+1))) {
			return nil, fmt.Errorf("all-gather-v from rank %d: %d bytes, want %d of %d", q, len(got[q]), 700*(q+1), q+1)
		}
		h.Write(got[q])
	}
	counts := make([]int, n)
	total := 0
	for q := range counts {
		counts[q] = 1500 + 7*q
		total += counts[q]
	}
	rs := make([]float32, total)
	for i := range rs {
		rs[i] = in(me, i)
	}
	part, err := c.ReduceScatterV(F32Bytes(rs), counts, F32)
	if err != nil {
		return nil, err
	}
	h.Write(part)
	big := make([]byte, 10000)
	for i := range big {
		big[i] = byte(i*7 + 1)
	}
	var mine []byte
	if me == n-1 {
		mine = big
	}
	b, err := c.Broadcast(mine, n-1)
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(b, big) {
		return nil, fmt.Errorf("broadcast: got %d bytes, not the root's %d", len(b), len(big))
	}
	// All-to-all-v: grouped ncclSend/ncclRecv (across processes the emulated NCCL's files).
	// Twice, so each pair's second message follows its first in order.
	for round := range 2 {
		msg := func(from, to int) []byte {
			return bytes.Repeat([]byte{byte(16*from + to + 1 + 64*round)}, 300*(from+1)+13*to+round*1000)
		}
		send := make([][]byte, n)
		for q := range send {
			send[q] = msg(me, q)
		}
		recv, err := c.AllToAllV(send)
		if err != nil {
			return nil, err
		}
		for q := range n {
			if !bytes.Equal(recv[q], msg(q, me)) {
				return nil, fmt.Errorf("all-to-all-v %d from rank %d: %d bytes, want %d", round, q, len(recv[q]), len(msg(q, me)))
			}
			h.Write(recv[q])
		}
	}
	return h.Sum(nil), nil
}

// TestEmulatedNCCLPeer is rank 1 of TestEmulatedNCCLProcesses when RESIN_NCCL_PEER_ID is
// set: it joins that communicator on emulated GPU 1, runs collectives and prints its
// digest; with RESIN_NCCL_PEER_DIE it exits after its first all-reduce instead, a peer
// dying while rank 0 waits in the next collective.
func TestEmulatedNCCLPeer(t *testing.T) {
	raw := os.Getenv("RESIN_NCCL_PEER_ID")
	if raw == "" {
		t.Skip("rank 1 of TestEmulatedNCCLProcesses")
	}
	var id cudart.NCCLUniqueID
	if b, err := hex.DecodeString(raw); err != nil || len(b) != len(id.Internal) {
		t.Fatalf("RESIN_NCCL_PEER_ID %q: %v", raw, err)
	} else {
		copy(id.Internal[:], b)
	}
	d, err := cudart.OpenDevice(1)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	c, err := NewNCCL(d, id, 2, 1, Options{Timeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("RESIN_NCCL_PEER_STALL") != "" {
		time.Sleep(5 * time.Minute) // joined, never arrives: rank 0 kills it when done
	}
	if os.Getenv("RESIN_NCCL_PEER_GRAPH") != "" {
		// An all-reduce replayed from a CUDA graph, while rank 0 runs its own eagerly.
		err := d.Do(func(ctx *cudart.Ctx) error {
			s, err := ctx.NewStream()
			if err != nil {
				return err
			}
			defer ctx.DestroyStream(s)
			buf, err := ctx.Alloc(4 * 8)
			if err != nil {
				return err
			}
			defer ctx.Free(buf)
			g, err := ctx.Capture(s, func() error { return c.Comm.AllReduce(buf.Ptr, buf.Ptr, 8, cudart.F32, cudart.Sum, s) })
			if err != nil {
				return err
			}
			defer ctx.DestroyGraphExec(g)
			if err := ctx.LaunchGraph(g, s); err != nil {
				return err
			}
			return ctx.Sync(s)
		})
		fmt.Printf("replayed: %v\n", err)
		return
	}
	if os.Getenv("RESIN_NCCL_PEER_DIE") != "" {
		if err := AllReduceF32(c, make([]float32, 8)); err != nil {
			t.Fatal(err)
		}
		os.Exit(3)
	}
	digest, err := collectives(c)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("digest %x\n", digest)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestEmulatedNCCLProcesses: two ranks of one emulated NCCL communicator in two processes
// (rank 1 a child of the test binary, meeting rank 0 in the id's shared-memory segment,
// the collectives split in 4 KiB chunks) give the same bits as the two ranks in one
// process; a peer that exits while rank 0 waits in a collective fails it with an error
// naming rank 1 and its exit, rather than hanging until RESIN_EMU_NCCL_TIMEOUT.
func TestEmulatedNCCLProcesses(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2", "RESIN_EMU_NCCL_CHUNK=4096", "RESIN_EMU_NCCL_TIMEOUT=600") {
		return
	}
	devs := openDevices(t, 2)
	o := Options{Timeout: 2 * time.Minute}
	// In one process.
	cs := joinNCCL(t, devs, o)
	local, lerrs := runAll(cs, collectives)
	for r, err := range lerrs {
		if err != nil {
			t.Fatalf("in one process, rank %d: %v", r, err)
		}
		cs[r].Close()
	}

	peer := func(env ...string) (*cudart.NCCLUniqueID, *exec.Cmd, *bytes.Buffer) { return startPeer(t, env...) }

	// Across two processes.
	pid, cmd, out := peer()
	c, err := NewNCCL(devs[0], *pid, 2, 0, o)
	if err != nil {
		t.Fatal(err)
	}
	digest, err := collectives(c)
	if err != nil {
		t.Fatalf("rank 0 across processes: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("rank 1's process: %v\n%s", err, out)
	}
	if !bytes.Equal(digest, local[0]) {
		t.Errorf("rank 0 across processes: digest %x, in one process %x", digest, local[0])
	}
	if want := fmt.Sprintf("digest %x\n", local[1]); !strings.Contains(out.String(), want) {
		t.Errorf("rank 1 across processes printed\n%s\nwant %q (its result in one process)", out, want)
	}
	key := "/dev/shm/" + strings.TrimRight(string(pid.Internal[:]), "\x00")
	if _, err := os.Stat(key); !os.IsNotExist(err) {
		t.Errorf("the communicator's shared-memory segment is still there: %v", err)
	}
	if left, _ := filepath.Glob(key + "-p2p-*"); len(left) > 0 {
		t.Errorf("point-to-point message files left in /dev/shm: %v", left)
	}

	// A peer that replays the all-reduce from a CUDA graph while rank 0 runs it eagerly:
	// both fail, naming NCCL's rule (the ranks meet in shared memory here).
	pid, cmd, out = peer("RESIN_NCCL_PEER_GRAPH=1")
	if c, err = NewNCCL(devs[0], *pid, 2, 0, o); err != nil {
		t.Fatal(err)
	}
	err = AllReduceF32(c, make([]float32, 8))
	if err == nil || !strings.Contains(err.Error(), "graph-captured must be uniform over the ranks") {
		t.Errorf("an eager all-reduce against rank 1's graph replay: %v, want NCCL's graph rule named", err)
	}
	if werr := cmd.Wait(); werr != nil || !strings.Contains(out.String(), "graph-captured must be uniform over the ranks") {
		t.Errorf("rank 1's replay against rank 0's eager all-reduce: %v\n%s", werr, out)
	}
	c.Close()

	// A peer that exits: rank 0's next collective fails naming it.
	pid, cmd, out = peer("RESIN_NCCL_PEER_DIE=1")
	go cmd.Wait() // reaped while rank 0 waits: a zombie or a gone process, both count as exited
	c, err = NewNCCL(devs[0], *pid, 2, 0, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := AllReduceF32(c, make([]float32, 8)); err != nil {
		t.Fatalf("the first all-reduce: %v\n%s", err, out)
	}
	err = AllReduceF32(c, make([]float32, 8))
	if err == nil || !strings.Contains(err.Error(), "rank 1") || !strings.Contains(err.Error(), "exited") {
		t.Fatalf("all-reduce with rank 1's process gone: %v, want an error naming rank 1 and its exit", err)
	}
	t.Logf("with rank 1 gone: %v", err)
	if err := AllReduceF32(c, make([]float32, 8)); err == nil {
		t.Error("the communicator that lost a rank ran another all-reduce")
	}
	c.Close()
}

// startPeer starts rank 1 of a new communicator as a child of the test binary
// (TestEmulatedNCCLPeer) with env added, and returns the communicator's id.
func startPeer(t *testing.T, env ...string) (*cudart.NCCLUniqueID, *exec.Cmd, *bytes.Buffer) {
	t.Helper()
	id, err := cudart.NewNCCLUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestEmulatedNCCLPeer$", "-test.v")
	cmd.Env = append(os.Environ(), append(env, "RESIN_NCCL_PEER_ID="+hex.EncodeToString(id.Internal[:]))...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return &id, cmd, &out
}

// stalledPeer joins rank 0 of a new communicator with o on emulated GPU 0 (returned, with
// the communicator; both closed when the test ends), rank 1 a child process that joins
// and never arrives at a collective.
func stalledPeer(t *testing.T, o Options) (*NCCL, *cudart.Device) {
	t.Helper()
	d, err := cudart.OpenDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	id, cmd, out := startPeer(t, "RESIN_NCCL_PEER_STALL=1")
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	c, err := NewNCCL(d, *id, 2, 0, o)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Cleanup(func() { c.Close() })
	return c, d
}

// TestEmulatedNCCLLatePeer: a peer in another process that joined but never arrives at
// the collective fails rank 0's after RESIN_EMU_NCCL_TIMEOUT (2 s here), the error naming
// rank 1 and the deadline, rather than hanging.
func TestEmulatedNCCLLatePeer(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2", "RESIN_EMU_NCCL_TIMEOUT=2") {
		return
	}
	c, _ := stalledPeer(t, Options{Timeout: 2 * time.Minute})
	err := AllReduceF32(c, make([]float32, 8))
	if err == nil || !strings.Contains(err.Error(), "waiting for rank 1 to arrive") || !strings.Contains(err.Error(), "within 2 s") {
		t.Fatalf("all-reduce with rank 1 stalled: %v, want an error naming rank 1 and the 2 s deadline", err)
	}
	t.Logf("with rank 1 stalled: %v", err)
}

// TestEmulatedNCCLTimeoutAborts: under RESIN_EMU_NCCL_HANG=1 the emulated NCCL waits for
// a peer that never arrives as NCCL does, for good; NCCL's deadline (Options.Timeout, 2 s
// here) fails the collective with ErrTimeout and aborts the communicator, which frees the
// device thread that waited inside it: the device runs the next call.
func TestEmulatedNCCLTimeoutAborts(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2", "RESIN_EMU_NCCL_HANG=1") {
		return
	}
	c, d := stalledPeer(t, Options{Timeout: 2 * time.Second})
	err := AllReduceF32(c, make([]float32, 8))
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "aborted") {
		t.Fatalf("all-reduce with rank 1 stalled: %v, want ErrTimeout and the abort", err)
	}
	t.Logf("with rank 1 stalled: %v", err)
	free := make(chan error, 1)
	go func() { free <- d.Do(func(*cudart.Ctx) error { return nil }) }()
	select {
	case err := <-free:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the device thread is still inside the aborted all-reduce")
	}
	// Closing the broken communicator says why it broke and frees its scratch buffer.
	n := c
	if n.scratch.Size == 0 {
		t.Fatal("the all-reduce staged nothing in the scratch buffer")
	}
	if err := c.Close(); !errors.Is(err, ErrTimeout) {
		t.Errorf("Close after the abort: %v, want the timeout", err)
	}
	if n.scratch.Size != 0 {
		t.Errorf("Close after the abort left the %d-byte scratch buffer", n.scratch.Size)
	}
}

// TestEmulatedNCCLLateRankInProcess: ranks of one process meet in the emulated NCCL's
// in-process group; a rank that never arrives at a collective (its step failed before it)
// fails the others' wait after RESIN_EMU_NCCL_TIMEOUT (2 s here), naming it, instead of
// hanging them, and the group stays failed for the late rank too (its ranks are out of
// step), as a real NCCL communicator after an abort.
func TestEmulatedNCCLLateRankInProcess(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2", "RESIN_EMU_NCCL_TIMEOUT=2") {
		return
	}
	devs := openDevices(t, 2)
	cs := joinNCCL(t, devs, Options{Timeout: time.Minute})
	defer cs[0].Close()
	defer cs[1].Close()
	err := AllReduceF32(cs[0], make([]float32, 8))
	if err == nil || !strings.Contains(err.Error(), "rank(s) 1 did not arrive within 2 s") {
		t.Fatalf("all-reduce with rank 1 absent: %v, want an error naming rank 1 and the 2 s deadline", err)
	}
	t.Logf("with rank 1 absent: %v", err)
	if err := AllReduceF32(cs[1], make([]float32, 8)); err == nil || !strings.Contains(err.Error(), "the communicator is broken") {
		t.Fatalf("rank 1's all-reduce after rank 0 gave up: %v, want the broken group's error", err)
	}
}

// openDevices opens emulated GPUs 0..n-1, closed when the test ends.
func openDevices(t *testing.T, n int) []*cudart.Device {
	t.Helper()
	devs := make([]*cudart.Device, n)
	for i := range devs {
		d, err := cudart.OpenDevice(i)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		devs[i] = d
	}
	return devs
}

// joinNCCL joins one NCCL communicator of a new id over devs, rank r on devs[r], the
// ranks goroutines of this process.
func joinNCCL(t *testing.T, devs []*cudart.Device, o Options) []Communicator {
	t.Helper()
	id, err := cudart.NewNCCLUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	cs := make([]Communicator, len(devs))
	errs := make(chan error, len(devs))
	for r := range devs {
		go func() {
			c, err := NewNCCL(devs[r], id, len(devs), r, o)
			cs[r] = c
			errs <- err
		}()
	}
	for range devs {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	return cs
}
