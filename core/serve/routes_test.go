package serve

import (
	"encoding/json"
	"net/http"
	"testing"
)

// A route's path asked with the wrong method answers 405 with an Allow header and an
// OpenAI error body; a path no route serves stays 404 without one.
func TestWrongMethodIs405(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	for _, c := range []struct {
		method, path string
		status       int
		allow        string
	}{
		{http.MethodGet, "/v1/completions", 405, "POST"},
		{http.MethodGet, "/v1/chat/completions", 405, "POST"},
		{http.MethodPut, "/v1/chat/completions", 405, "POST"},
		{http.MethodDelete, "/v1/completions", 405, "POST"},
		{http.MethodPost, "/v1/models", 405, "GET, HEAD"},
		{http.MethodPost, "/v1/models/tiny-test", 405, "GET, HEAD"},
		{http.MethodPost, "/health", 405, "GET, HEAD"},
		{http.MethodPatch, "/metrics", 405, "GET, HEAD"},
		{http.MethodGet, "/v1/embeddings", 404, ""},
		{http.MethodPost, "/nowhere", 404, ""},
	} {
		req, err := http.NewRequest(c.method, h.ts.URL+c.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body := readAll(t, resp)
		name := c.method + " " + c.path
		if resp.StatusCode != c.status {
			t.Errorf("%s: status %d, want %d: %s", name, resp.StatusCode, c.status, body)
			continue
		}
		if got := resp.Header.Get("Allow"); got != c.allow {
			t.Errorf("%s: Allow %q, want %q", name, got, c.allow)
		}
		var e errorResp
		if err := json.Unmarshal([]byte(body), &e); err != nil {
			t.Errorf("%s: body is not an OpenAI error: %v: %s", name, err, body)
			continue
		}
		wantCode := "not_found"
		if c.status == 405 {
			wantCode = "method_not_allowed"
		}
		if e.Error.Type != "invalid_request_error" || e.Error.Code == nil || *e.Error.Code != wantCode || e.Error.Message == "" {
			t.Errorf("%s: error %+v, want type invalid_request_error code %s", name, e.Error, wantCode)
		}
	}
	// HEAD is served wherever GET is.
	resp, err := http.Head(h.ts.URL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("HEAD /health: status %d, want 200", resp.StatusCode)
	}
}
