package serve

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// CORS: browsers call the API from pages of other origins only when it answers their
// preflight (OPTIONS with Access-Control-Request-Method) and marks its answers with
// Access-Control-Allow-Origin. The defaults are vLLM's (--allowed-origins '*', no
// credentials) and llama.cpp server's: any origin may call, as any local program may.
// Config.AllowedOrigins narrows that to a list, or turns CORS off (then no answer carries
// the headers, and a preflight gets 403 naming the origin, where it got 405 before).
// A browser never sends the API key cross-origin on its own (no cookies are involved), so
// a key-protected server stays protected: the page must hold the key.

// corsPolicy is Config's CORS settings, resolved once.
type corsPolicy struct {
	any         bool     // "*" among the origins
	origins     []string // exact origins, as browsers send them (scheme://host[:port])
	credentials bool
}

// CheckOrigins reports the first of origins that no browser's Origin header can equal:
// one without a scheme or host ("ui.example"), or with a path, query or credentials,
// which would otherwise be accepted and never match, so that its pages fail their
// preflight with no sign why. "*", "" and "null" (sandboxed pages' origin) pass.
func CheckOrigins(origins []string) error {
	for _, o := range origins {
		o = strings.TrimRight(strings.TrimSpace(o), "/")
		if o == "" || o == "*" || o == "null" {
			continue
		}
		u, err := url.Parse(o)
		if err != nil || u.Scheme == "" || u.Host == "" || u.Path != "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil || u.Opaque != "" {
			return fmt.Errorf("allowed origin %q is not an origin: write scheme://host[:port], as browsers send it in the Origin header (e.g. https://ui.example or http://localhost:3000)", o)
		}
	}
	return nil
}

func newCORSPolicy(origins []string, credentials bool) corsPolicy {
	p := corsPolicy{credentials: credentials}
	for _, o := range origins {
		o = strings.TrimRight(strings.TrimSpace(o), "/")
		if o != "*" {
			o = strings.ToLower(o) // browsers send scheme and host in lower case
		}
		switch o {
		case "":
		case "*":
			p.any = true
		default:
			p.origins = append(p.origins, o)
		}
	}
	return p
}

func (p corsPolicy) off() bool { return !p.any && len(p.origins) == 0 }

func (p corsPolicy) allows(origin string) bool {
	return p.any || slices.Contains(p.origins, origin)
}

// cors wraps h: answers preflights itself and marks the answers to allowed origins.
func (s *Server) cors(h http.Handler) http.Handler {
	p := s.corsPolicy
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		preflight := r.Method == http.MethodOptions && origin != "" && r.Header.Get("Access-Control-Request-Method") != ""
		hdr := w.Header()
		if !p.off() && (p.credentials || !p.any) {
			// The answer depends on the Origin, also when none was sent: a cache must not
			// hand a browser page the copy fetched without one (no Allow-Origin).
			hdr.Add("Vary", "Origin")
		}
		if origin == "" || (p.off() && !preflight) {
			h.ServeHTTP(w, r)
			return
		}
		if p.off() || (p.any && !p.credentials) {
			hdr.Add("Vary", "Origin")
		}
		if !p.allows(origin) {
			if preflight {
				s.metrics.requests.WithLabelValues("preflight", "403").Inc()
				refuse(w, r, &apiError{status: http.StatusForbidden, typ: "invalid_request_error", code: "cors_origin_not_allowed",
					message: "Origin " + origin + " is not allowed (serve --allowed-origins lists the origins that are)."})
				return
			}
			h.ServeHTTP(w, r) // no CORS headers: the browser withholds the answer
			return
		}
		if p.credentials || !p.any {
			hdr.Set("Access-Control-Allow-Origin", origin)
		} else {
			hdr.Set("Access-Control-Allow-Origin", "*")
		}
		if p.credentials {
			hdr.Set("Access-Control-Allow-Credentials", "true")
		}
		if !preflight {
			h.ServeHTTP(w, r)
			return
		}
		// The preflight's answer: whatever method and headers it asks for (vLLM's "*"),
		// echoed, since a literal "*" does not cover Authorization.
		hdr.Add("Vary", "Access-Control-Request-Method")
		hdr.Add("Vary", "Access-Control-Request-Headers")
		hdr.Set("Access-Control-Allow-Methods", r.Header.Get("Access-Control-Request-Method"))
		if h := r.Header.Get("Access-Control-Request-Headers"); h != "" {
			hdr.Set("Access-Control-Allow-Headers", h)
		}
		hdr.Set("Access-Control-Max-Age", "600")
		s.metrics.requests.WithLabelValues("preflight", "204").Inc()
		w.WriteHeader(http.StatusNoContent)
	})
}
