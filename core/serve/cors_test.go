package serve

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// corsDo sends method path with an Origin (and, for a preflight, the Access-Control-
// Request-* headers) and returns the answer's status, headers and body.
func corsDo(t *testing.T, h *harness, method, path, origin string, hdr map[string]string, body string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, h.ts.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, readAll(t, resp)
}

var preflightHeaders = map[string]string{
	"Access-Control-Request-Method":  "POST",
	"Access-Control-Request-Headers": "authorization, content-type",
}

// By default, as vLLM's --allowed-origins '*': a browser's preflight for a keyed chat
// request is answered 204 with the method and headers it asked for (Authorization
// included, which a literal "*" would not cover), and the request itself carries
// Access-Control-Allow-Origin; the API key is still required. Before, the preflight got
// 405 and browsers could not call the server at all.
func TestCORSDefaultAllowsAnyOrigin(t *testing.T) {
	h := newHarness(t, harnessOpts{cfg: func(c *Config) { c.APIKey = "k" }})
	code, hdr, body := corsDo(t, h, http.MethodOptions, "/v1/chat/completions", "http://app.example", preflightHeaders, "")
	if code != http.StatusNoContent {
		t.Fatalf("preflight: %d %s", code, body)
	}
	for k, want := range map[string]string{
		"Access-Control-Allow-Origin":  "*",
		"Access-Control-Allow-Methods": "POST",
		"Access-Control-Allow-Headers": "authorization, content-type",
	} {
		if got := hdr.Get(k); got != want {
			t.Errorf("preflight %s = %q, want %q", k, got, want)
		}
	}
	if hdr.Get("Access-Control-Allow-Credentials") != "" {
		t.Errorf("credentials allowed by default")
	}
	req := `{"model":"tiny-test","prompt":"hi","max_tokens":2}`
	code, hdr, body = corsDo(t, h, http.MethodPost, "/v1/completions", "http://app.example",
		map[string]string{"Content-Type": "application/json", "Authorization": "Bearer k"}, req)
	if code != 200 || hdr.Get("Access-Control-Allow-Origin") != "*" {
		t.Errorf("POST from an origin: %d, Allow-Origin %q: %s", code, hdr.Get("Access-Control-Allow-Origin"), body)
	}
	code, hdr, _ = corsDo(t, h, http.MethodPost, "/v1/completions", "http://app.example",
		map[string]string{"Content-Type": "application/json"}, req)
	if code != http.StatusUnauthorized || hdr.Get("Access-Control-Allow-Origin") != "*" {
		t.Errorf("POST without the key: %d (want 401, readable by the page), Allow-Origin %q", code, hdr.Get("Access-Control-Allow-Origin"))
	}
	// No Origin: no CORS headers, and OPTIONS without a preflight's headers stays 405.
	code, hdr, _ = corsDo(t, h, http.MethodOptions, "/v1/chat/completions", "", nil, "")
	if code != http.StatusMethodNotAllowed || hdr.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("plain OPTIONS: %d, Allow-Origin %q", code, hdr.Get("Access-Control-Allow-Origin"))
	}
}

// A list of origins echoes an allowed one (with Vary: Origin) and refuses the preflight of
// any other with 403 naming it; with credentials the origin is echoed, never "*"; an empty
// list turns CORS off.
func TestCORSAllowedOrigins(t *testing.T) {
	h := newHarness(t, harnessOpts{cfg: func(c *Config) {
		c.AllowedOrigins = []string{"https://ui.example/", "http://localhost:3000"}
		c.AllowCredentials = true
	}})
	code, hdr, body := corsDo(t, h, http.MethodOptions, "/v1/models", "https://ui.example", preflightHeaders, "")
	if code != http.StatusNoContent || hdr.Get("Access-Control-Allow-Origin") != "https://ui.example" ||
		hdr.Get("Access-Control-Allow-Credentials") != "true" || !strings.Contains(strings.Join(hdr.Values("Vary"), ","), "Origin") {
		t.Errorf("allowed preflight: %d %v %s", code, hdr, body)
	}
	code, hdr, body = corsDo(t, h, http.MethodOptions, "/v1/models", "https://evil.example", preflightHeaders, "")
	var e errorResp
	if code != http.StatusForbidden || hdr.Get("Access-Control-Allow-Origin") != "" || json.Unmarshal([]byte(body), &e) != nil ||
		!strings.Contains(e.Error.Message, "https://evil.example") {
		t.Errorf("other origin's preflight: %d %v %s", code, hdr, body)
	}
	code, hdr, _ = corsDo(t, h, http.MethodGet, "/v1/models", "https://evil.example", nil, "")
	if code != 200 || hdr.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("GET from another origin: %d, Allow-Origin %q (want none: the browser withholds it)", code, hdr.Get("Access-Control-Allow-Origin"))
	}
	off := newHarness(t, harnessOpts{cfg: func(c *Config) { c.AllowedOrigins = []string{} }})
	code, hdr, _ = corsDo(t, off, http.MethodGet, "/v1/models", "https://ui.example", nil, "")
	if code != 200 || hdr.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("CORS off: GET %d, Allow-Origin %q", code, hdr.Get("Access-Control-Allow-Origin"))
	}
	if code, _, _ = corsDo(t, off, http.MethodOptions, "/v1/models", "https://ui.example", preflightHeaders, ""); code != http.StatusForbidden {
		t.Errorf("CORS off: preflight %d, want 403", code)
	}
}

// CheckOrigins takes what browsers send as Origin ("*", "null", scheme://host[:port], a
// trailing slash forgiven) and refuses what none sends; an origin configured in upper case
// matches the lower-case one browsers send.
func TestCORSOriginsChecked(t *testing.T) {
	for _, ok := range []string{"*", "", "null", "https://ui.example", "http://localhost:3000/", "https://UI.example"} {
		if err := CheckOrigins([]string{ok}); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"ui.example", "localhost:3000", "https://ui.example/app", "https://ui.example?x=1", "https://u:p@ui.example", `["*"]`} {
		if err := CheckOrigins([]string{"https://fine.example", bad}); err == nil || !strings.Contains(err.Error(), strconv.Quote(bad)) {
			t.Errorf("%q: %v, want an error naming it", bad, err)
		}
	}
	h := newHarness(t, harnessOpts{cfg: func(c *Config) { c.AllowedOrigins = []string{"https://UI.example"} }})
	if code, hdr, body := corsDo(t, h, http.MethodOptions, "/v1/models", "https://ui.example", preflightHeaders, ""); code != http.StatusNoContent || hdr.Get("Access-Control-Allow-Origin") != "https://ui.example" {
		t.Errorf("upper-case configured origin: %d %v %s", code, hdr, body)
	}
}

// With a list of origins (or credentials) an answer depends on the Origin, so it says
// Vary: Origin also to a request that sent none: a shared cache would otherwise hand the
// copy without Access-Control-Allow-Origin to an allowed page, which the browser then
// withholds. Any origin without credentials ("*") answers the same to all and needs none.
func TestCORSVaryWithoutOrigin(t *testing.T) {
	list := newHarness(t, harnessOpts{cfg: func(c *Config) { c.AllowedOrigins = []string{"https://ui.example"} }})
	code, hdr, _ := corsDo(t, list, http.MethodGet, "/v1/models", "", nil, "")
	if code != 200 || !slices.Contains(hdr.Values("Vary"), "Origin") {
		t.Errorf("list of origins, no Origin sent: %d, Vary %q", code, hdr.Values("Vary"))
	}
	if _, hdr, _ = corsDo(t, list, http.MethodGet, "/v1/models", "https://ui.example", nil, ""); strings.Count(strings.Join(hdr.Values("Vary"), ","), "Origin") != 1 {
		t.Errorf("allowed origin: Vary %q, want Origin once", hdr.Values("Vary"))
	}
	anyOrigin := newHarness(t, harnessOpts{})
	if _, hdr, _ = corsDo(t, anyOrigin, http.MethodGet, "/v1/models", "", nil, ""); len(hdr.Values("Vary")) != 0 {
		t.Errorf("any origin, no Origin sent: Vary %q, want none", hdr.Values("Vary"))
	}
}
