package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

// Version is the protocol version this package speaks. A peer that speaks another one is
// refused at the handshake with ErrVersion.
const Version = 1

// Magic opens the Hello message.
const Magic = "RSNW"

// DefaultMaxFrame is the largest frame either side accepts unless configured otherwise
// (64 MiB: a 256-sequence prefill step of 8k tokens each with whole page tables is ~20 MiB).
const DefaultMaxFrame = 64 << 20

// Kind is a frame's message kind, its first byte.
type Kind uint8

// The message kinds. See docs/runner-protocol.md for their payloads.
const (
	KindHello    Kind = 1 // engine → runner: magic, version, max frame, capabilities
	KindInfo     Kind = 2 // runner → engine: version, capabilities, RunnerInfo
	KindStep     Kind = 3 // engine → runner: one step (plan, table deltas, cache ops, releases)
	KindResult   Kind = 4 // runner → engine: the StepResult of a step
	KindError    Kind = 5 // either way: an error, about a step or the session
	KindShutdown Kind = 6 // engine → runner: exit cleanly (no payload, no answer)
)

func (k Kind) String() string {
	switch k {
	case KindHello:
		return "hello"
	case KindInfo:
		return "info"
	case KindStep:
		return "step"
	case KindResult:
		return "result"
	case KindError:
		return "error"
	case KindShutdown:
		return "shutdown"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

var (
	// ErrMalformed is wrapped by every error about bytes that do not decode.
	ErrMalformed = errors.New("wire: malformed message")
	// ErrVersion: the peer speaks another protocol version.
	ErrVersion = errors.New("wire: protocol version mismatch")
	// ErrFrameTooLarge: a frame's length exceeds the configured maximum.
	ErrFrameTooLarge = errors.New("wire: frame exceeds the maximum size")
)

// Frame layout: length u32 (little endian; the bytes that follow: the kind byte and the
// payload, so at least 1) | kind u8 | payload.
const frameHeader = 5

// AppendFrame appends a frame of kind k holding payload to dst.
func AppendFrame(dst []byte, k Kind, payload []byte) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(payload)+1))
	dst = append(dst, byte(k))
	return append(dst, payload...)
}

// beginFrame appends a frame header whose length is filled in by finishFrame, so a
// payload can be encoded in place.
func beginFrame(dst []byte, k Kind) []byte {
	return append(dst, 0, 0, 0, 0, byte(k))
}

func finishFrame(frame []byte) []byte {
	binary.LittleEndian.PutUint32(frame, uint32(len(frame)-4))
	return frame
}

// textHint explains a frame header that reads as text: the peer wrote something else than
// frames, typically a runner that logs or prints to its stdout.
func textHint(hdr []byte) string {
	for _, c := range hdr {
		if c != '\t' && c != '\n' && c != '\r' && (c < 0x20 || c > 0x7e) {
			return ""
		}
	}
	return fmt.Sprintf(" (its length bytes read as the text %q: only frames may be written to the stream; an exec runner logs to stderr, never stdout)", hdr)
}

// Deadliner is a connection whose reads can be bounded in time (net.Conn, *os.File pipes).
type Deadliner interface {
	SetReadDeadline(t time.Time) error
}

// FrameReader reads frames from r, refusing any longer than Max bytes before reading it.
type FrameReader struct {
	r   io.Reader
	Max int
	buf []byte
	hdr [frameHeader]byte
}

// NewFrameReader returns a reader of frames from r with the given maximum (0 =
// DefaultMaxFrame).
func NewFrameReader(r io.Reader, max int) *FrameReader {
	if max <= 0 {
		max = DefaultMaxFrame
	}
	return &FrameReader{r: r, Max: max}
}

// Read returns the next frame's kind and payload. The payload aliases the reader's
// buffer until the next Read. A stream that ends between frames returns io.EOF; one that
// ends inside a frame returns io.ErrUnexpectedEOF.
func (fr *FrameReader) Read() (Kind, []byte, error) {
	if _, err := io.ReadFull(fr.r, fr.hdr[:4]); err != nil {
		return 0, nil, err
	}
	n := binary.LittleEndian.Uint32(fr.hdr[:4])
	if n == 0 {
		return 0, nil, fmt.Errorf("%w: frame of length 0 has no kind byte", ErrMalformed)
	}
	if int64(n) > int64(fr.Max) {
		return 0, nil, fmt.Errorf("%w: a frame of %d bytes, the limit is %d%s", ErrFrameTooLarge, n, fr.Max, textHint(fr.hdr[:4]))
	}
	// The buffer grows with the bytes that actually arrive, at most doubling, so a length
	// that lies (a truncated or hostile stream) costs no allocation of that size.
	fr.buf = fr.buf[:0]
	for got := 0; got < int(n); {
		want := int(n)
		if want > cap(fr.buf) {
			want = min(want, max(2*cap(fr.buf), growChunk))
			grown := make([]byte, want)
			copy(grown, fr.buf[:got])
			fr.buf = grown
		}
		fr.buf = fr.buf[:want]
		k, err := io.ReadFull(fr.r, fr.buf[got:want])
		got += k
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return 0, nil, fmt.Errorf("wire: read a frame of %d bytes: %w (%d read)", n, err, got)
		}
	}
	return Kind(fr.buf[0]), fr.buf[1:], nil
}

// growChunk is the most a FrameReader allocates ahead of the bytes it has read.
const growChunk = 1 << 20
