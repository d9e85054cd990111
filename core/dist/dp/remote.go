package dp

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/lockstep"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// Ranks in worker processes. The Group, the engines and the Coordinator stay in rank 0's
// process: a dp rank r ≥ 1 whose model runs in a worker process of the same host has
// RemoteForward as its Rank.Forward, which sends each of its steps' plans (its engine's
// plans and its idle plans, DP set) to the worker over a control communicator of two
// ranks (this process rank 0, the worker rank 1) and waits for the worker's logits rows;
// the worker (ServeForward) runs the plan through its model, whose expert exchanges meet
// the other ranks' on a data communicator across the processes (JoinShm's). The engine
// of rank r keeps its pool's page bookkeeping in rank 0's process (LedgerPool), the
// worker the cache itself, on which it executes each plan's CacheOps first.

const (
	replyLogits byte = 1
	replyError  byte = 2
	replyDrafts byte = 3
)

// RemoteForward is the Forward of dp rank rank, run by a worker process behind ctl (rank
// 0 of two; the worker, rank 1, runs ServeForward): the plan goes out by lockstep's plan
// message, and the worker replies with the logits rows or the error its forward returned.
// ctl's failures (the worker gone, its deadline) come back as a *dist.PeerError naming
// rank, not the pair's rank 1, so that a launcher can put the worker's exit on them.
func RemoteForward(ctl dist.Communicator, rank int) Forward {
	return remoteForward(ctl, rank, fmt.Sprintf("dp rank %d", rank))
}

// remoteForward is RemoteForward of the worker of rank rank (the launcher's numbering:
// its rank of the processes), name naming it in the errors.
func remoteForward(ctl dist.Communicator, rank int, name string) Forward {
	var msg []byte
	return func(p *engine.BatchPlan, logits []float32) error {
		if err := lockstep.Broadcast(ctl, p, &msg); err != nil {
			return peerAs(fmt.Sprintf("%s: send the plan of step %d to its worker", name, p.Step), err, rank)
		}
		reply, err := ctl.Broadcast(nil, 1)
		if err != nil {
			return peerAs(fmt.Sprintf("%s: wait for its worker's step %d", name, p.Step), err, rank)
		}
		if len(reply) == 0 {
			return fmt.Errorf("%s: an empty reply from its worker for step %d", name, p.Step)
		}
		switch reply[0] {
		case replyError:
			re, err := decodeError(reply[1:])
			if err != nil {
				return fmt.Errorf("%s: its worker's reply to step %d: %w", name, p.Step, err)
			}
			return fmt.Errorf("%s's worker: %w", name, re)
		case replyLogits:
			if len(reply)-1 != 4*len(logits) {
				return fmt.Errorf("%s: its worker replied %d bytes of logits for step %d, want %d", name, len(reply)-1, p.Step, 4*len(logits))
			}
			copy(dist.F32Bytes(logits), reply[1:]) // the same host: the same byte order
			return nil
		}
		return fmt.Errorf("%s: reply kind %d from its worker", name, reply[0])
	}
}

// peerAs is err wrapped in what, a *dist.PeerError within it renamed to rank.
func peerAs(what string, err error, rank int) error {
	var pe *dist.PeerError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %w", what, &dist.PeerError{Op: pe.Op, Peer: rank, Err: pe.Err})
	}
	return fmt.Errorf("%s: %w", what, err)
}

// RemoteDraft is the Draft of dp rank rank whose worker process drafts behind ctl (its
// RemoteForward's pair; the worker runs ServeRank with its draft step): the step's result
// goes out by lockstep's result message, and the worker replies with the drafts it
// proposes, which fill res (NumNextDrafts, Drafts) for this rank's engine, or with its
// draft step's error. Failures of ctl come back as RemoteForward's do.
func RemoteDraft(ctl dist.Communicator, rank int) Draft {
	return Draft(lockstep.LeadDraft(ctl, func(p *engine.BatchPlan, res *engine.StepResult) error {
		reply, err := ctl.Broadcast(nil, 1)
		if err != nil {
			return peerAs(fmt.Sprintf("dp rank %d: wait for its worker's drafts of step %d", rank, p.Step), err, rank)
		}
		if len(reply) == 0 {
			return fmt.Errorf("dp rank %d: an empty draft reply from its worker for step %d", rank, p.Step)
		}
		switch reply[0] {
		case replyError:
			re, err := decodeError(reply[1:])
			if err != nil {
				return fmt.Errorf("dp rank %d: its worker's draft reply to step %d: %w", rank, p.Step, err)
			}
			return fmt.Errorf("dp rank %d's worker: draft: %w", rank, re)
		case replyDrafts:
			if err := decodeDrafts(reply[1:], p, res); err != nil {
				return fmt.Errorf("dp rank %d: its worker's drafts of step %d: %w", rank, p.Step, err)
			}
			return nil
		}
		return fmt.Errorf("dp rank %d: draft reply kind %d from its worker", rank, reply[0])
	}))
}

// appendDrafts encodes a draft reply: replyDrafts, then res.NumNextDrafts (one per
// sequence) and res.Drafts, each a u32 count and int32s, little-endian.
func appendDrafts(b []byte, res *engine.StepResult) []byte {
	b = append(b, replyDrafts)
	for _, xs := range [2][]int32{res.NumNextDrafts, res.Drafts} {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(xs)))
		for _, x := range xs {
			b = binary.LittleEndian.AppendUint32(b, uint32(x))
		}
	}
	return b
}

// decodeDrafts decodes a draft reply (without its first byte) into res for plan p: one
// count per sequence, none negative, and as many drafts as they add up to.
func decodeDrafts(b []byte, p *engine.BatchPlan, res *engine.StepResult) error {
	var lists [2][]int32
	for k := range lists {
		if len(b) < 4 {
			return errors.New("a truncated draft reply")
		}
		m := int(binary.LittleEndian.Uint32(b))
		b = b[4:]
		if m < 0 || len(b) < 4*m {
			return errors.New("a truncated draft reply")
		}
		for i := range m {
			lists[k] = append(lists[k], int32(binary.LittleEndian.Uint32(b[4*i:])))
		}
		b = b[4*m:]
	}
	if len(b) != 0 {
		return fmt.Errorf("%d bytes after the drafts", len(b))
	}
	counts, drafts := lists[0], lists[1]
	if len(counts) != p.NumSeqs() {
		return fmt.Errorf("draft counts for %d sequences, the plan has %d", len(counts), p.NumSeqs())
	}
	total := 0
	for i, c := range counts {
		if c < 0 {
			return fmt.Errorf("sequence %d: %d drafts", i, c)
		}
		total += int(c)
	}
	if total != len(drafts) {
		return fmt.Errorf("counts adding up to %d drafts, %d sent", total, len(drafts))
	}
	res.NumNextDrafts = append(res.NumNextDrafts[:0], counts...)
	res.Drafts = append(res.Drafts[:0], drafts...)
	return nil
}

// ServeForward is ServeRank for a dp rank that does not draft.
func ServeForward(ctl dist.Communicator, vocab int, forward Forward) error {
	return ServeRank(ctl, vocab, forward, nil)
}

// ServeRank is a worker's end of RemoteForward and, when draft is set, RemoteDraft: ctl
// is rank 1 of the pair, forward the dp rank's forward (over its own cache, CacheOps
// executed: lockstep.WithCacheOps), vocab the columns of a logits row, draft its draft
// step (it fills res.NumNextDrafts and res.Drafts). It runs every plan rank 0 sends and
// replies with its logits, and every step result with the drafts, or either with its
// error, until lockstep.Stop or rank 0 is gone. A failed forward or draft does not end
// it: rank 0 ends the group and stops the workers, so that a worker process exits before
// the stop only when it dies, and the exit a launcher puts on the step's error
// (core/dist/launch: the first worker to exit, when the error names none) is the dead
// one's. At the stop it returns the first error.
func ServeRank(ctl dist.Communicator, vocab int, forward Forward, draft Draft) error {
	var logits []float32
	var reply []byte
	var failed error
	var drafts lockstep.Draft
	if draft != nil {
		drafts = func(p *engine.BatchPlan, res *engine.StepResult) error {
			if derr := draft(p, res); derr != nil {
				reply = appendError(reply[:0], derr)
				failed = cmp.Or(failed, fmt.Errorf("draft of step %d: %w", p.Step, derr))
			} else {
				reply = appendDrafts(reply[:0], res)
			}
			if _, err := ctl.Broadcast(reply, 1); err != nil {
				return fmt.Errorf("reply to rank 0: %w", err)
			}
			return nil
		}
	}
	err := lockstep.FollowSteps(ctl, func(p *engine.BatchPlan) error {
		n := len(p.LogitsIndices) * vocab
		if cap(logits) < n {
			logits = make([]float32, n)
		}
		ferr := forward(p, logits[:n])
		if ferr != nil {
			reply = appendError(reply[:0], ferr)
			failed = cmp.Or(failed, fmt.Errorf("step %d: %w", p.Step, ferr))
		} else {
			reply = append(append(reply[:0], replyLogits), dist.F32Bytes(logits[:n])...)
		}
		if _, err := ctl.Broadcast(reply, 1); err != nil {
			return fmt.Errorf("reply to rank 0: %w", err)
		}
		return nil
	}, drafts)
	return errors.Join(failed, err)
}

// appendError encodes a forward's error reply: replyError; the *dist.PeerError within it,
// if any, as its kind (0: none, 1: ErrPeerGone, 2: ErrTimeout, 3: another), its rank (i32)
// and its collective (u16 length and bytes); then the error's text. Rank 0 rebuilds the
// PeerError (remoteError), so that a rank the worker saw gone is named as a peer there
// too: the data group's ranks are the dp ranks.
func appendError(b []byte, err error) []byte {
	b = append(b, replyError)
	var pe *dist.PeerError
	if !errors.As(err, &pe) {
		return append(append(b, 0), err.Error()...)
	}
	kind := byte(3)
	switch {
	case errors.Is(pe.Err, dist.ErrPeerGone):
		kind = 1
	case errors.Is(pe.Err, dist.ErrTimeout):
		kind = 2
	}
	b = append(b, kind)
	b = binary.LittleEndian.AppendUint32(b, uint32(int32(pe.Peer)))
	b = binary.LittleEndian.AppendUint16(b, uint16(min(len(pe.Op), 1<<16-1)))
	b = append(b, pe.Op[:min(len(pe.Op), 1<<16-1)]...)
	return append(b, err.Error()...)
}

// remoteError is a worker's forward error at rank 0: its text, and the PeerError it held.
type remoteError struct {
	text string
	peer *dist.PeerError // nil: none
}

func (e *remoteError) Error() string { return e.text }

func (e *remoteError) Unwrap() error {
	if e.peer == nil {
		return nil
	}
	return e.peer
}

// decodeError decodes an error reply (after its first byte).
func decodeError(b []byte) (*remoteError, error) {
	if len(b) < 1 {
		return nil, errors.New("a truncated error reply")
	}
	kind, b := b[0], b[1:]
	if kind == 0 {
		return &remoteError{text: string(b)}, nil
	}
	if len(b) < 6 {
		return nil, errors.New("a truncated error reply")
	}
	peer, n := int(int32(binary.LittleEndian.Uint32(b))), int(binary.LittleEndian.Uint16(b[4:]))
	if b = b[6:]; len(b) < n {
		return nil, errors.New("a truncated error reply")
	}
	op, text := string(b[:n]), string(b[n:])
	cause := errors.New("failed")
	switch kind {
	case 1:
		cause = dist.ErrPeerGone
	case 2:
		cause = dist.ErrTimeout
	}
	return &remoteError{text: text, peer: &dist.PeerError{Op: op, Peer: peer, Err: cause}}, nil
}

// StopRemote ends the workers behind ctl (the pairs of RemoteForward; nil entries are
// skipped) and closes the pairs; it returns the failures to tell a worker, naming its
// rank (a worker already gone fails so).
func StopRemote(ctl []dist.Communicator) error {
	var errs []error
	for r, c := range ctl {
		if c == nil {
			continue
		}
		if err := lockstep.Stop(c); err != nil {
			errs = append(errs, fmt.Errorf("dp rank %d: stop its worker: %w", r, err))
		}
		c.Close()
	}
	return errors.Join(errs...)
}

// JoinShm joins the shared-memory groups of a host's dp ranks, one process each, that
// meet at name: data, rank of size (the models' expert exchanges, each wait bounded by
// o.Timeout), and the control pairs of RemoteForward: a worker waits there for its next
// plan as long as the engines idle, rank 0 for a worker's reply to one plan up to
// o.StepTimeout (StepTimeoutOr: a worker alive but stuck outside any collective fails the
// step naming its rank instead of hanging the group). Rank 0 gets ctl[r] for each worker
// r (ctl[0] nil), a worker r ctl[0], its pair. hello is every rank's too, for while the
// ranks open (the GPU ranks' NCCL rendezvous, the barrier once all have loaded): its
// waits last o.JoinTimeout, as long as a rank may take to read its weights, where data's
// last o.Timeout; close it once the ranks have opened.
// Rank 0 joins the pairs in rank order, then data and hello, as the workers do theirs;
// o.Cancel ends a join whose peer will never come (a launcher closes it when a worker
// exits).
func JoinShm(name string, rank, size int, o dist.Options) (ctl []dist.Communicator, data, hello dist.Communicator, err error) {
	return joinRanks(rank, size, o, func(group string, rank, size int, o dist.Options) (dist.Communicator, error) {
		return dist.JoinShm(name+"-"+group, rank, size, o)
	})
}

// JoinTCP is JoinShm across hosts: the same groups, met over TCP at addr (rank 0, which
// listens there, hosting every group's rendezvous in turn; dist.JoinTCP's Options.Group
// tells them apart, prefixed by o.Group).
func JoinTCP(addr string, rank, size int, o dist.Options) (ctl []dist.Communicator, data, hello dist.Communicator, err error) {
	prefix := o.Group
	return joinRanks(rank, size, o, func(group string, rank, size int, o dist.Options) (dist.Communicator, error) {
		o.Group = prefix + "dp-" + group
		return dist.JoinTCP(addr, rank, size, o)
	})
}

// joinRanks is JoinShm's order of joins through join (group "ctl<r>", a pair, then
// "data" and "hello").
func joinRanks(rank, size int, o dist.Options, join func(group string, rank, size int, o dist.Options) (dist.Communicator, error)) (ctl []dist.Communicator, data, hello dist.Communicator, err error) {
	if size < 2 || rank < 0 || rank >= size {
		return nil, nil, nil, fmt.Errorf("dp: join rank %d of %d processes", rank, size)
	}
	fail := func(err error) ([]dist.Communicator, dist.Communicator, dist.Communicator, error) {
		for _, c := range append(ctl, data) {
			if c != nil {
				c.Close()
			}
		}
		return nil, nil, nil, err
	}
	po := o
	po.Timeout, po.JoinTimeout = 100*365*24*time.Hour, o.JoinTimeout
	if po.JoinTimeout <= 0 {
		po.JoinTimeout = o.Timeout
	}
	pair := func(r int) string { return fmt.Sprintf("ctl%d", r) }
	if rank == 0 {
		ro := po
		ro.Timeout = o.StepTimeoutOr() // rank 0 waits on its pairs only within a step
		ctl = make([]dist.Communicator, size)
		for r := 1; r < size; r++ {
			if ctl[r], err = join(pair(r), 0, 2, ro); err != nil {
				return fail(fmt.Errorf("dp rank 0: join rank %d's control pair: %w", r, peerAs("join", err, r)))
			}
		}
	} else {
		c, err := join(pair(rank), 1, 2, po)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("dp rank %d: join its control pair: %w", rank, err)
		}
		ctl = []dist.Communicator{c}
	}
	if data, err = join("data", rank, size, o); err != nil {
		return fail(fmt.Errorf("dp rank %d: join the data group: %w", rank, err))
	}
	ho := po
	ho.Timeout = po.JoinTimeout
	if hello, err = join("hello", rank, size, ho); err != nil {
		return fail(fmt.Errorf("dp rank %d: join the hello group: %w", rank, err))
	}
	return ctl, data, hello, nil
}

// LedgerPool is a pool with like's cache groups and geometry (the same slabs, so the same
// page ids) whose arena holds no bytes: the page bookkeeping of a dp rank whose cache
// lives in a worker process (opened there with like's size), for that rank's engine in
// rank 0's process. The engine's page copies on it do nothing; the worker executes them
// from the plan's CacheOps.
func LedgerPool(like *kvslab.Pool) (*kvslab.Pool, error) {
	p, err := kvslab.New(kvslab.Config{Groups: like.Groups(), SlabBytes: like.SlabBytes()}, ledger(like.Arena().Size()))
	if err != nil {
		return nil, fmt.Errorf("dp: a ledger pool: %w", err)
	}
	if p.Slabs() != like.Slabs() || p.BlockTokens() != like.BlockTokens() {
		return nil, fmt.Errorf("dp: a ledger pool of %d slabs of %d-token pages for a pool of %d of %d", p.Slabs(), p.BlockTokens(), like.Slabs(), like.BlockTokens())
	}
	return p, nil
}

// ledger is an arena of its size that stores nothing (LedgerPool).
type ledger int64

func (a ledger) Size() int64 { return int64(a) }

func (ledger) Copy(dst, src, n int64) error { return nil }

// RemoteRanks are the Group ranks of rank 0's process when every dp rank has a process of
// its own on this host: rank 0's forward runs here, rank r's in the worker behind ctl[r]
// (RemoteForward; ctl as JoinShm gives rank 0), each rank's plans having cacheGroups cache
// groups. The steppers' clock and count exchange are communicators of this process (o
// bounds the count exchange), since every engine is here.
func RemoteRanks(forward0 Forward, ctl []dist.Communicator, cacheGroups int, o dist.Options) ([]Rank, error) {
	return RemoteTPRanks(forward0, nil, ctl, 1, cacheGroups, o)
}

// RemoteTPRanks is RemoteRanks with attention TP (AttentionTP's layout) over processes:
// ctl's len(ctl) = n·tp processes are n dp ranks of tp ranks each (process w: tp rank
// w%tp of dp rank w/tp), forward0 process 0's own rank's. Dp rank d's forward sends each
// plan to its tp ranks at once (the first of dp rank 0 runs here) and takes the first
// one's logits; check (nil: none), forward0's rank's plan check, refuses a plan of dp
// rank 0 with tokens before any rank sees it (it may touch that rank's pool, so it is
// not run on the other dp ranks' plans).
// Every worker runs ServeRank on its pair, its cache pool its own.
func RemoteTPRanks(forward0 Forward, check func(*engine.BatchPlan, []float32) error, ctl []dist.Communicator, tp, cacheGroups int, o dist.Options) ([]Rank, error) {
	if tp < 1 || len(ctl)%tp != 0 || len(ctl) < 2*tp || ctl[0] != nil {
		return nil, fmt.Errorf("dp: remote ranks want rank 0's control pairs (ctl[0] nil, one per worker) for 2 or more dp ranks of tp=%d, got %d", tp, len(ctl))
	}
	n := len(ctl) / tp
	clock, err := dist.NewInProcess(n, dist.Options{Timeout: 100 * 365 * 24 * time.Hour}) // the engines may idle
	if err != nil {
		return nil, err
	}
	counts, err := dist.NewInProcess(n, o)
	if err != nil {
		return nil, err
	}
	ranks := make([]Rank, n)
	for r := range n {
		fs := make([]Forward, tp)
		for t := range fs {
			w := r*tp + t
			switch {
			case w == 0:
				fs[t] = forward0
			case tp == 1:
				fs[t] = RemoteForward(ctl[w], w)
			default:
				fs[t] = remoteForward(ctl[w], w, fmt.Sprintf("dp rank %d's tp rank %d", r, t))
			}
		}
		f := fs[0]
		if tp > 1 {
			// check is process 0's rank's (a model's CheckPlan may bind the plan's
			// sequences to its own pool: glm-5-flash clears a new sequence's KDA state),
			// so it checks dp rank 0's plans only; the others' first ranks are workers.
			c := check
			if r > 0 {
				c = nil
			}
			f = tpFanOut(fs, c)
		}
		ranks[r] = Rank{Forward: f, CacheGroups: cacheGroups, Ctl: clock[r], Data: counts[r]}
	}
	return ranks, nil
}

// tpFanOut runs each plan on a dp rank's tp ranks at once (their forwards fs, whose
// collectives meet each other's), after check on a plan with tokens; the logits are the
// first rank's, the others' dropped.
func tpFanOut(fs []Forward, check func(*engine.BatchPlan, []float32) error) Forward {
	scratch := make([][]float32, len(fs))
	return func(p *engine.BatchPlan, logits []float32) error {
		if check != nil && p.NumTokens() > 0 {
			if err := check(p, logits); err != nil {
				return err
			}
		}
		errs := make([]error, len(fs))
		var wg sync.WaitGroup
		for t := 1; t < len(fs); t++ {
			if cap(scratch[t]) < len(logits) {
				scratch[t] = make([]float32, len(logits))
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[t] = fs[t](p, scratch[t][:len(logits)])
			}()
		}
		errs[0] = fs[0](p, logits)
		wg.Wait()
		return errors.Join(errs...)
	}
}
