package wire

import (
	"fmt"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// Capability bits, exchanged in Hello (what the engine can send) and Info (what the runner
// uses). A bit set by only one side is off for the session.
const (
	// CapCacheOps: the runner executes the step's cache operations (page copies). A runner
	// without it refuses a step that carries any.
	CapCacheOps uint32 = 1 << iota
	// CapReleases: the runner drops the state of released requests (the engine sends the
	// notices either way; a runner may ignore them).
	CapReleases
	// CapTokenMasks: the runner's sampler applies the step's token masks (grammar-
	// constrained requests, BatchPlan.TokenMask); it is the runner's
	// engine.RunnerInfo.TokenMasks. The engine sends constrained requests only to a
	// runner with it.
	CapTokenMasks
)

// Hello is the engine's first message.
type Hello struct {
	Version  uint16
	MaxFrame uint32
	Caps     uint32
}

// AppendHello appends h's frame to dst.
func AppendHello(dst []byte, h Hello) []byte {
	e := enc{beginFrame(dst, KindHello)}
	e.b = append(e.b, Magic...)
	e.u16(h.Version)
	e.u16(0)
	e.u32(h.MaxFrame)
	e.u32(h.Caps)
	finishFrame(e.b[len(dst):])
	return e.b
}

// DecodeHello decodes a Hello payload. A version other than Version is ErrVersion.
func DecodeHello(payload []byte) (Hello, error) {
	d := newDec(payload, "hello")
	var h Hello
	if m := d.Take(4); d.Err == nil && string(m) != Magic {
		d.fail("magic %q, want %q", m, Magic)
	}
	h.Version = d.U16()
	if res := d.U16(); d.Err == nil && res != 0 {
		d.fail("reserved field %d", res)
	}
	h.MaxFrame, h.Caps = d.U32(), d.U32()
	if err := d.end(); err != nil {
		return h, err
	}
	if h.Version != Version {
		return h, fmt.Errorf("%w: the engine speaks version %d, this runner %d", ErrVersion, h.Version, Version)
	}
	return h, nil
}

// Info is the runner's answer to Hello: its protocol version, capabilities and the
// engine.RunnerInfo it declares (cache groups and their block size included).
type Info struct {
	Version uint16
	Caps    uint32
	Runner  engine.RunnerInfo
}

const flagAsyncTokens = 1

// AppendInfo appends m's frame to dst.
func AppendInfo(dst []byte, m Info) []byte {
	e := enc{beginFrame(dst, KindInfo)}
	ri := &m.Runner
	e.u16(m.Version)
	e.u16(0)
	caps := m.Caps
	if ri.TokenMasks {
		caps |= CapTokenMasks
	}
	e.u32(caps)
	e.str(ri.Name)
	e.u32(uint32(ri.VocabSize))
	e.u32(uint32(ri.MaxContext))
	e.u32(uint32(ri.MaxDrafts))
	var flags uint32
	if ri.AsyncTokens {
		flags |= flagAsyncTokens
	}
	e.u32(flags)
	e.u32(uint32(len(ri.EOS)))
	e.i32s(ri.EOS)
	e.u32(uint32(len(ri.GraphBuckets)))
	for _, b := range ri.GraphBuckets {
		e.u32(uint32(b))
	}
	e.u32(uint32(len(ri.CacheGroups)))
	for _, g := range ri.CacheGroups {
		e.str(g.Name)
		e.u8(uint8(g.Kind))
		e.u8(0)
		e.u16(0)
		for _, v := range [...]int{g.Layers, g.BytesPerToken, g.PageTokens, g.Window, g.Ratio, g.Checkpoints} {
			e.u32(uint32(v))
		}
	}
	finishFrame(e.b[len(dst):])
	return e.b
}

// DecodeInfo decodes an Info payload. A version other than Version is ErrVersion.
func DecodeInfo(payload []byte) (Info, error) {
	d := newDec(payload, "info")
	var m Info
	m.Version = d.U16()
	if res := d.U16(); d.Err == nil && res != 0 {
		d.fail("reserved field %d", res)
	}
	if d.Err == nil && m.Version != Version {
		return m, fmt.Errorf("%w: the runner speaks version %d, this engine %d", ErrVersion, m.Version, Version)
	}
	m.Caps = d.U32()
	ri := &m.Runner
	ri.TokenMasks = m.Caps&CapTokenMasks != 0
	ri.Name = d.str("name")
	ri.VocabSize, ri.MaxContext, ri.MaxDrafts = int(d.U32()), int(d.U32()), int(d.U32())
	flags := d.U32()
	if d.Err == nil && flags&^flagAsyncTokens != 0 {
		d.fail("unknown flags %#x", flags)
	}
	ri.AsyncTokens = flags&flagAsyncTokens != 0
	if n := d.count("eos", 4); n > 0 {
		ri.EOS = d.I32s(nil, n)
	}
	if n := d.count("graph buckets", 4); n > 0 {
		ri.GraphBuckets = make([]int, n)
		for i := range ri.GraphBuckets {
			ri.GraphBuckets[i] = int(d.U32())
		}
	}
	ng := d.count("cache groups", 32)
	for i := 0; i < ng && d.Err == nil; i++ {
		var g kvslab.GroupSpec
		g.Name = d.str("group name")
		g.Kind = kvslab.Kind(d.u8())
		if pad := uint32(d.u8()) | uint32(d.U16())<<8; d.Err == nil && pad != 0 {
			d.fail("group %d: padding %d", i, pad)
		}
		if d.Err == nil && g.Kind > kvslab.Recurrent {
			d.fail("group %d: unknown kind %d", i, g.Kind)
		}
		for _, p := range [...]*int{&g.Layers, &g.BytesPerToken, &g.PageTokens, &g.Window, &g.Ratio, &g.Checkpoints} {
			*p = int(d.U32())
		}
		ri.CacheGroups = append(ri.CacheGroups, g)
	}
	if err := d.end(); err != nil {
		return m, err
	}
	return m, nil
}

// AppendResult appends the frame of step's result res to dst.
func AppendResult(dst []byte, step uint64, res *engine.StepResult) []byte {
	e := enc{beginFrame(dst, KindResult)}
	e.u64(step)
	for _, n := range [...]int{len(res.Accepted), len(res.NumNextDrafts), len(res.Tokens), len(res.Drafts), len(res.Logprobs),
		len(res.TopTokens), len(res.TopLogprobs), len(res.PromptLogprobs), len(res.PromptTopTokens), len(res.PromptTopLogprobs)} {
		e.u32(uint32(n))
	}
	e.i32s(res.Accepted)
	e.i32s(res.NumNextDrafts)
	e.i32s(res.Tokens)
	e.i32s(res.Drafts)
	e.f32s(res.Logprobs)
	e.i32s(res.TopTokens)
	e.f32s(res.TopLogprobs)
	e.f32s(res.PromptLogprobs)
	e.i32s(res.PromptTopTokens)
	e.f32s(res.PromptTopLogprobs)
	finishFrame(e.b[len(dst):])
	return e.b
}

// DecodeResult decodes a Result payload into res, reusing its buffers, and returns the
// step it answers. Whether the result matches its plan is the engine's to check.
func DecodeResult(payload []byte, res *engine.StepResult) (uint64, error) {
	d := newDec(payload, "result")
	step := d.U64()
	var n [10]int
	total := 0
	for i := range n {
		n[i] = int(d.U32())
		total += n[i]
	}
	if d.Err == nil && int64(total)*4 != int64(d.Left()) {
		d.fail("counts %v need %d bytes, the payload has %d", n, int64(total)*4, d.Left())
	}
	res.Accepted = d.I32s(res.Accepted, n[0])
	res.NumNextDrafts = d.I32s(res.NumNextDrafts, n[1])
	res.Tokens = d.I32s(res.Tokens, n[2])
	res.Drafts = d.I32s(res.Drafts, n[3])
	res.Logprobs = d.F32s(res.Logprobs, n[4])
	res.TopTokens = d.I32s(res.TopTokens, n[5])
	res.TopLogprobs = d.F32s(res.TopLogprobs, n[6])
	res.PromptLogprobs = d.F32s(res.PromptLogprobs, n[7])
	res.PromptTopTokens = d.I32s(res.PromptTopTokens, n[8])
	res.PromptTopLogprobs = d.F32s(res.PromptTopLogprobs, n[9])
	return step, d.end()
}

// ErrorCode says what an Error message is about.
type ErrorCode uint16

const (
	// CodeStepFailed: the step named by the message failed; its requests fail, the
	// runner stays up and takes the next step.
	CodeStepFailed ErrorCode = 1
	// CodeFatal: the sender is going down (the runner cannot go on; the engine restarts it
	// or stays down).
	CodeFatal ErrorCode = 2
	// CodeProtocol: the sender could not decode what it received (bad frame, version,
	// size); it closes the session.
	CodeProtocol ErrorCode = 3
)

func (c ErrorCode) String() string {
	switch c {
	case CodeStepFailed:
		return "step failed"
	case CodeFatal:
		return "fatal"
	case CodeProtocol:
		return "protocol"
	}
	return fmt.Sprintf("code %d", uint16(c))
}

// Error is an Error message.
type Error struct {
	Step    uint64 // the step it is about; 0 when it is about the session
	Code    ErrorCode
	Message string
}

func (e *Error) Error() string {
	if e.Step != 0 {
		return fmt.Sprintf("runner: step %d: %s: %s", e.Step, e.Code, e.Message)
	}
	return fmt.Sprintf("runner: %s: %s", e.Code, e.Message)
}

// AppendError appends m's frame to dst.
func AppendError(dst []byte, m Error) []byte {
	e := enc{beginFrame(dst, KindError)}
	e.u64(m.Step)
	e.u16(uint16(m.Code))
	e.u16(0)
	e.str(m.Message)
	finishFrame(e.b[len(dst):])
	return e.b
}

// DecodeError decodes an Error payload.
func DecodeError(payload []byte) (Error, error) {
	d := newDec(payload, "error")
	var m Error
	m.Step = d.U64()
	m.Code = ErrorCode(d.U16())
	if res := d.U16(); d.Err == nil && res != 0 {
		d.fail("reserved field %d", res)
	}
	m.Message = d.str("message")
	return m, d.end()
}

// AppendShutdown appends a Shutdown frame (no payload) to dst.
func AppendShutdown(dst []byte) []byte { return AppendFrame(dst, KindShutdown, nil) }

// DecodeShutdown checks a Shutdown payload, which is empty.
func DecodeShutdown(payload []byte) error {
	if len(payload) != 0 {
		return fmt.Errorf("%w: shutdown: %d bytes of payload, want none", ErrMalformed, len(payload))
	}
	return nil
}
