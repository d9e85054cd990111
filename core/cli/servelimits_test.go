package cli

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cli/clitest"
)

// The connection-limit flags reach the server: --enable-pprof serves profiles (behind
// the key), --max-connections 0 leaves connections uncounted, --idle-timeout closes an
// idle kept-alive connection, /version names the served model, and --allowed-origins
// lists the origins CORS answers.
func TestServeLimitFlags(t *testing.T) {
	dir := modelDir(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := clitest.StartServe(t, ctx, ServeCmd(NewModelDir("test", testOpener)),
		"--model", dir, "--port", "0", "--served-model-name", "tiny", "--api-key", "k",
		"--enable-pprof", "--max-connections", "0", "--idle-timeout", "100ms", "--allowed-origins", "http://a.example,http://b.example")
	get := func(path string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer k")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/debug/pprof/"); code != 200 {
		t.Errorf("--enable-pprof: /debug/pprof/ %d %.200s", code, body)
	}
	if code, body := get("/version"); code != 200 || !strings.Contains(body, `"model":"tiny"`) {
		t.Errorf("/version: %d %s", code, body)
	}
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/version", nil)
	req.Header.Set("Origin", "http://b.example")
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.Header.Get("Access-Control-Allow-Origin") != "http://b.example" {
		t.Errorf("--allowed-origins: Access-Control-Allow-Origin %q, want the listed origin echoed", resp.Header.Get("Access-Control-Allow-Origin"))
	}
	if _, body := get("/metrics"); !strings.Contains(body, `resin_http_connections_open{model_name="tiny"} 0`) {
		t.Errorf("--max-connections 0 still counts connections")
	}
	c, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(c)
	resp, err := http.ReadResponse(rd, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	if _, err := rd.ReadByte(); err != io.EOF {
		t.Errorf("--idle-timeout 100ms: idle connection read %v, want EOF", err)
	}
	cancel()
	if err := srv.Wait(); err != nil {
		t.Fatalf("serve: %v", err)
	}
}

// An --allowed-origins value no browser's Origin header can equal (no scheme, a path) is
// refused naming the flag, before the model loads (the model here does not exist), where it
// was taken and silently failed every preflight from the page it was meant to admit.
func TestServeAllowedOriginsChecked(t *testing.T) {
	for _, o := range []string{"ui.example", "https://ui.example/app", "localhost:3000"} {
		_, _, err := run(t, ServeCmd(NewModelDir("test", testOpener)), "--model", filepath.Join(t.TempDir(), "absent"), "--port", "0", "--allowed-origins", o)
		if err == nil || !strings.Contains(err.Error(), "--allowed-origins") || !strings.Contains(err.Error(), o) {
			t.Errorf("--allowed-origins %s: %v", o, err)
		}
	}
}
