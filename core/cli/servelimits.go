package cli

import (
	"time"

	"github.com/spf13/cobra"
)

// connLimits are serve's connection-safety flags (and the CORS ones). On the command line 0 turns a limit
// off; serve.Config takes a negative value for that.
type connLimits struct {
	read, header, idle time.Duration
	headerBytes        int
	conns              int
	tokenize           int64
	pprof              bool
	origins            []string
	credentials        bool
}

func (l *connLimits) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.DurationVar(&l.read, "read-timeout", 60*time.Second, "cut off a client whose request (headers and body) takes longer to arrive (408; 0 = never)")
	f.DurationVar(&l.header, "read-header-timeout", 10*time.Second, "cut off a client whose request headers take longer to arrive (0 = never)")
	f.DurationVar(&l.idle, "idle-timeout", 60*time.Second, "close a kept-alive connection idle for this long (0 = never)")
	f.IntVar(&l.headerBytes, "max-header-bytes", 64<<10, "largest request line and headers accepted")
	f.IntVar(&l.conns, "max-connections", 1024, "connections open at once; at the cap a new one replaces the connection idle longest, or gets 503 when all are serving requests (0 = no cap)")
	f.Int64Var(&l.tokenize, "tokenize-budget-bytes", 32<<20, "prompt bytes tokenized at once, all requests together; more get 429 (raised to the largest prompt the context allows)")
	f.StringSliceVar(&l.origins, "allowed-origins", []string{"*"}, "origins (scheme://host[:port], comma-separated) whose browser pages may call the API, as vLLM's; \"*\" for any, \"\" for none (CORS off)")
	f.BoolVar(&l.credentials, "allow-credentials", false, "answer credentialed cross-origin requests (cookies, HTTP auth) from the allowed origins")
	f.BoolVar(&l.pprof, "enable-pprof", false, "serve Go profiles under /debug/pprof/ (behind --api-key when set)")
}

// noLimit maps the command line's 0 (no limit) to serve.Config's negative value.
func noLimit[T time.Duration | int](v T) T {
	if v == 0 {
		return -1
	}
	return v
}

// nonNil keeps an empty --allowed-origins list meaning "none" (serve.Config reads nil as
// the default, any origin).
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
