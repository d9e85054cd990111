package dist

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"
)

// in is rank r's i-th input value: irregular, so that the order of a sum shows in its bits.
func in(r, i int) float32 {
	return float32(math.Sin(float64(7*r+3*i+1))) * float32(1+i%5) * 1e-1
}

// exercise runs every collective on c with uneven sizes (some ranks sending nothing) and
// checks each result against a serial reference computed here; it returns a digest of
// all results, for comparing two runs.
func exercise(c Communicator) ([]byte, error) {
	n, me := c.Size(), c.Rank()
	h := sha256.New()
	put := func(b []byte) { binary.Write(h, binary.LittleEndian, uint64(len(b))); h.Write(b) }
	serialSum := func(i int) float32 { // the reference: rank order, float32
		acc := in(0, i)
		for q := 1; q < n; q++ {
			acc += in(q, i)
		}
		return acc
	}

	// All-reduce, f32 and bf16, 37 elements.
	x := make([]float32, 37)
	for i := range x {
		x[i] = in(me, i)
	}
	if err := AllReduceF32(c, x); err != nil {
		return nil, err
	}
	for i, v := range x {
		if v != serialSum(i) {
			return nil, fmt.Errorf("all-reduce f32 [%d] = %g, want %g", i, v, serialSum(i))
		}
	}
	put(F32Bytes(x))
	xb := make([]uint16, 37)
	for i := range xb {
		xb[i] = toBF16(in(me, i))
	}
	if err := c.AllReduce(BF16Bytes(xb), BF16); err != nil {
		return nil, err
	}
	for i, v := range xb {
		acc := math.Float32frombits(uint32(toBF16(in(0, i))) << 16)
		for q := 1; q < n; q++ {
			acc += math.Float32frombits(uint32(toBF16(in(q, i))) << 16)
		}
		if v != toBF16(acc) {
			return nil, fmt.Errorf("all-reduce bf16 [%d] = %#x, want %#x", i, v, toBF16(acc))
		}
	}
	put(BF16Bytes(xb))

	// All-gather-v: rank r sends (5r)%7 bytes, so rank 0 sends none.
	msg := func(r int) []byte {
		b := make([]byte, (5*r)%7)
		for i := range b {
			b[i] = byte(r*31 + i)
		}
		return b
	}
	got, err := c.AllGatherV(msg(me))
	if err != nil {
		return nil, err
	}
	for q := range n {
		if !bytes.Equal(got[q], msg(q)) {
			return nil, fmt.Errorf("all-gather-v from rank %d = %v, want %v", q, got[q], msg(q))
		}
		put(got[q])
	}

	// Reduce-scatter-v: counts (3q+2)%5, one of them zero for four ranks or more.
	counts := make([]int, n)
	total := 0
	for q := range counts {
		counts[q] = (3*q + 2) % 5
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
	off := 0
	for _, k := range counts[:me] {
		off += k
	}
	if len(part) != 4*counts[me] {
		return nil, fmt.Errorf("reduce-scatter-v gave %d bytes, want %d", len(part), 4*counts[me])
	}
	for i := range counts[me] {
		if v := math.Float32frombits(binary.LittleEndian.Uint32(part[4*i:])); v != serialSum(off+i) {
			return nil, fmt.Errorf("reduce-scatter-v [%d] = %g, want %g", i, v, serialSum(off+i))
		}
	}
	put(part)

	// All-to-all-v: rank r sends (r+2q)%4 bytes to rank q.
	a2a := func(r, q int) []byte {
		b := make([]byte, (r+2*q)%4)
		for i := range b {
			b[i] = byte(100*r + 10*q + i)
		}
		return b
	}
	send := make([][]byte, n)
	for q := range send {
		send[q] = a2a(me, q)
	}
	recv, err := c.AllToAllV(send)
	if err != nil {
		return nil, err
	}
	for q := range n {
		if !bytes.Equal(recv[q], a2a(q, me)) {
			return nil, fmt.Errorf("all-to-all-v from rank %d = %v, want %v", q, recv[q], a2a(q, me))
		}
		put(recv[q])
	}

	// Broadcast from the last rank, 3000 bytes (several shared-memory slots in the test).
	big := make([]byte, 3000)
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
		return nil, fmt.Errorf("broadcast: got %d bytes, not the root's 3000", len(b))
	}
	if err := c.Barrier(); err != nil {
		return nil, err
	}

	// Split by parity, ranked in reverse: the subgroup's ranks and sums follow.
	sub, err := c.Split(me%2, -me)
	if err != nil {
		return nil, err
	}
	defer sub.Close()
	var members []int
	for q := n - 1; q >= 0; q-- {
		if q%2 == me%2 {
			members = append(members, q)
		}
	}
	if sub.Size() != len(members) || members[sub.Rank()] != me {
		return nil, fmt.Errorf("split: rank %d of %d, want the place of %d in %v", sub.Rank(), sub.Size(), me, members)
	}
	y := []float32{in(me, 0), in(me, 1)}
	if err := AllReduceF32(sub, y); err != nil {
		return nil, err
	}
	for i := range y {
		want := in(members[0], i)
		for _, q := range members[1:] {
			want += in(q, i)
		}
		if y[i] != want {
			return nil, fmt.Errorf("split all-reduce [%d] = %g, want %g", i, y[i], want)
		}
	}
	put(F32Bytes(y))
	return h.Sum(nil), nil
}

// runAll runs f on every rank of cs at once and returns each rank's result.
func runAll(cs []Communicator, f func(Communicator) ([]byte, error)) ([][]byte, []error) {
	out, errs := make([][]byte, len(cs)), make([]error, len(cs))
	var wg sync.WaitGroup
	for r, c := range cs {
		wg.Add(1)
		go func() { defer wg.Done(); out[r], errs[r] = f(c) }()
	}
	wg.Wait()
	return out, errs
}

// TestInProcessCollectives runs every collective on 1 to 5 in-process ranks against the
// serial reference, twice: the two runs' results are the same bits.
func TestInProcessCollectives(t *testing.T) {
	for n := 1; n <= 5; n++ {
		var first [][]byte
		for run := range 2 {
			cs, err := NewInProcess(n, Options{Timeout: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			digests, errs := runAll(cs, exercise)
			for r, err := range errs {
				if err != nil {
					t.Fatalf("%d ranks, rank %d: %v", n, r, err)
				}
			}
			if run == 1 {
				for r := range digests {
					if !bytes.Equal(digests[r], first[r]) {
						t.Fatalf("%d ranks, rank %d: the second run differs", n, r)
					}
				}
			}
			first = digests
			for _, c := range cs {
				c.Close()
			}
		}
	}
}

// TestInProcessMissingPeer: a rank that never calls the collective fails the others
// within the deadline with an error naming it; a rank that closes fails them at once.
func TestInProcessMissingPeer(t *testing.T) {
	// Seconds, not milliseconds: rank 1's goroutine must post within the deadline of rank
	// 0's, or rank 0 names rank 1, the first rank missing then.
	cs, _ := NewInProcess(3, Options{Timeout: 2 * time.Second})
	_, errs := runAll(cs[:2], func(c Communicator) ([]byte, error) { return nil, c.Barrier() })
	for r, err := range errs {
		var pe *PeerError
		if !errors.As(err, &pe) || pe.Peer != 2 || !errors.Is(err, ErrTimeout) {
			t.Fatalf("rank %d: %v, want a timeout naming rank 2", r, err)
		}
	}
	cs, _ = NewInProcess(2, Options{Timeout: time.Minute})
	done := make(chan error, 1)
	go func() { done <- AllReduceF32(cs[0], []float32{1}) }()
	cs[1].Close()
	select {
	case err := <-done:
		var pe *PeerError
		if !errors.As(err, &pe) || pe.Peer != 1 || !errors.Is(err, ErrPeerGone) {
			t.Fatalf("%v, want rank 1 gone", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the all-reduce waited on a closed peer")
	}
}

// TestBadArguments: wrong shapes are errors, not panics.
func TestBadArguments(t *testing.T) {
	cs, _ := NewInProcess(1, Options{})
	c := cs[0]
	if err := c.AllReduce(make([]byte, 3), F32); err == nil {
		t.Fatal("3 bytes of f32 accepted")
	}
	if err := c.AllReduce(make([]byte, 4), DType(9)); err == nil {
		t.Fatal("unknown dtype accepted")
	}
	if _, err := c.ReduceScatterV(make([]byte, 8), []int{1}, F32); err == nil {
		t.Fatal("counts short of the buffer accepted")
	}
	if _, err := c.AllToAllV(nil); err == nil {
		t.Fatal("no messages accepted")
	}
	if _, err := c.Broadcast(nil, 1); err == nil {
		t.Fatal("root outside the group accepted")
	}
}

// TestLayout splits 8 ranks as dp=2 × cp=2 × tp=2 with ep=4: each group holds the ranks
// the layout says, in rank order, and an all-gather over it sees exactly them.
func TestLayout(t *testing.T) {
	cs, _ := NewInProcess(8, Options{Timeout: 10 * time.Second})
	type got struct{ tp, cp, dp, ep []int }
	res := make([]got, 8)
	_, errs := runAll(cs, func(c Communicator) ([]byte, error) {
		l, err := NewLayout(c, 2, 2, 4)
		if err != nil {
			return nil, err
		}
		defer l.Close()
		members := func(g Communicator) []int {
			all, err := g.AllGatherV([]byte{byte(c.Rank())})
			if err != nil {
				t.Error(err)
				return nil
			}
			var out []int
			for _, m := range all {
				out = append(out, int(m[0]))
			}
			return out
		}
		res[c.Rank()] = got{members(l.TP), members(l.CP), members(l.DP), members(l.EP)}
		return nil, nil
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for r, g := range res {
		want := got{
			tp: []int{r &^ 1, r | 1},
			cp: []int{r &^ 2, r | 2},
			dp: []int{r &^ 4, r | 4},
			ep: []int{r &^ 3, r&^3 + 1, r&^3 + 2, r&^3 + 3},
		}
		if fmt.Sprint(g) != fmt.Sprint(want) {
			t.Fatalf("rank %d: groups %v, want %v", r, g, want)
		}
	}
	if _, err := NewLayout(cs[0], 3, 1, 1); err == nil {
		t.Fatal("tp=3 accepted for 8 ranks")
	}
}

// TestOnEveryRankFailsFast: a rank whose open fails before the collective its peers wait
// in closes its communicator, so they fail as a peer gone, not at their deadline (20 s
// here; the CLI's is a minute).
func TestOnEveryRankFailsFast(t *testing.T) {
	comms, err := NewInProcess(3, Options{Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = OnEveryRank(comms, func(r int, c Communicator) error {
		if r == 1 {
			return errors.New("rank 1: no weight experts.7.w1")
		}
		_, err := c.Broadcast([]byte{byte(r)}, 0)
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "no weight experts.7.w1") {
		t.Fatalf("OnEveryRank: %v, want rank 1's error", err)
	}
	if !errors.Is(err, ErrPeerGone) || errors.Is(err, ErrTimeout) {
		t.Fatalf("OnEveryRank: %v, want its peers to fail as a peer gone, not at the deadline", err)
	}
}
