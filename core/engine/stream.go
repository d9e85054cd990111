package engine

import (
	"context"
	"io"
	"sync"
)

// Stream delivers one request's events. The engine never blocks on a slow reader: tokens
// produced while nobody reads are merged into the next event. A step's tokens become
// visible together, so the token that ends a request comes in the event that says so.
type Stream struct {
	id    string
	ready chan struct{} // capacity 1: "something new"

	mu        sync.Mutex
	tokens    []int32 // what the next Recv returns
	logprobs  []TokenLogprob
	held      []int32 // tokens of the step being emitted (push), until flush or end
	heldLps   []TokenLogprob
	promptLps []TokenLogprob
	finish    FinishReason
	err       error
	usage     Usage
	delivered bool // the terminal event was returned

	stopWatch func() bool // stops the context watch set up by Submit
}

func newStream(id string) *Stream {
	return &Stream{id: id, ready: make(chan struct{}, 1)}
}

// ID returns the request's id.
func (s *Stream) ID() string { return s.id }

// Recv returns the next event, waiting for one. After the terminal event it returns
// io.EOF. A done ctx returns ctx.Err() and leaves the request running (cancel the context
// given to Submit, or call Abort, to stop it).
func (s *Stream) Recv(ctx context.Context) (Event, error) {
	for {
		s.mu.Lock()
		if s.delivered {
			s.mu.Unlock()
			return Event{}, io.EOF
		}
		if len(s.tokens) > 0 || s.finish != FinishNone {
			ev := Event{Tokens: s.tokens, Logprobs: s.logprobs, PromptLogprobs: s.promptLps}
			s.tokens, s.logprobs, s.promptLps = nil, nil, nil
			if s.finish != FinishNone {
				ev.Finish, ev.Err, ev.Usage = s.finish, s.err, s.usage
				s.delivered = true
			}
			s.mu.Unlock()
			return ev, nil
		}
		s.mu.Unlock()
		select {
		case <-s.ready:
		case <-ctx.Done():
			return Event{}, ctx.Err()
		}
	}
}

// Done reports whether the terminal event has been produced (it may not be read yet).
func (s *Stream) Done() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.finish != FinishNone
}

// push adds a token to those held back: the reader sees them at the step's flush or at
// the finish, so that the last token and the finish reason come in one event.
func (s *Stream) push(tok int32, lp *TokenLogprob) {
	s.mu.Lock()
	s.held = append(s.held, tok)
	if lp != nil {
		s.heldLps = append(s.heldLps, *lp)
	}
	s.mu.Unlock()
}

// release makes the held tokens visible to Recv (s.mu held).
func (s *Stream) release() {
	s.tokens = append(s.tokens, s.held...)
	s.logprobs = append(s.logprobs, s.heldLps...)
	s.held, s.heldLps = s.held[:0], s.heldLps[:0]
}

// flush shows the held tokens to the reader.
func (s *Stream) flush() {
	s.mu.Lock()
	n := len(s.held)
	s.release()
	s.mu.Unlock()
	if n > 0 {
		s.wake()
	}
}

func (s *Stream) end(reason FinishReason, err error, usage Usage) {
	s.mu.Lock()
	s.release()
	if s.finish == FinishNone {
		s.finish, s.err, s.usage = reason, err, usage
	}
	stop := s.stopWatch
	s.stopWatch = nil
	s.mu.Unlock()
	if stop != nil {
		stop()
	}
	s.wake()
}

func (s *Stream) wake() {
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

// Collect reads the stream to its end and returns every token and the terminal event.
func (s *Stream) Collect(ctx context.Context) ([]int32, Event, error) {
	var all []int32
	for {
		ev, err := s.Recv(ctx)
		if err == io.EOF {
			return all, Event{}, io.ErrUnexpectedEOF
		}
		if err != nil {
			return all, Event{}, err
		}
		all = append(all, ev.Tokens...)
		if ev.Finish != FinishNone {
			return all, ev, nil
		}
	}
}

// streamOutput is a Stream seen as the scheduler's Output.
type streamOutput Stream

func (o *streamOutput) Token(tok int32, lp *TokenLogprob) { (*Stream)(o).push(tok, lp) }

func (o *streamOutput) PromptLogprobs(lps []TokenLogprob) {
	s := (*Stream)(o)
	s.mu.Lock()
	s.promptLps = lps
	s.mu.Unlock()
}

func (o *streamOutput) Flush() { (*Stream)(o).flush() }

func (o *streamOutput) Finish(reason FinishReason, err error, usage Usage) {
	(*Stream)(o).end(reason, err, usage)
}
