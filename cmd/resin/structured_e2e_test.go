package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// structuredScript asks for structured outputs the way OpenAI SDK users do: parse() with
// a json_schema response_format, and tools with tool_choice "required" and a named
// function; it prints what the client got.
const structuredScript = `
const OpenAI = require(process.env.OPENAI_MODULES + "/openai");
const client = new OpenAI({ baseURL: process.env.BASE_URL + "/v1", apiKey: "e2e-key", maxRetries: 0 });
const messages = [{ role: "user", content: "Weather in Paris?" }];
const params = { type: "object", properties: {
  location: { type: "string", pattern: "^[A-Z][a-z]{1,8}$" },
  unit: { type: "string", enum: ["celsius", "fahrenheit"] },
  days: { type: "integer", minimum: 1, maximum: 14 } },
  required: ["location", "unit", "days"], additionalProperties: false };
const tools = [{ type: "function", function: { name: "get_weather", description: "Weather", parameters: params, strict: true } }];
(async () => {
  const out = { parsed: [], required: [], named: [] };
  for (let seed = 0; seed < 3; seed++) {
    const r = await client.chat.completions.parse({ model: "e2e", messages, max_tokens: 1500, temperature: 1, seed,
      response_format: { type: "json_schema", json_schema: { name: "weather", strict: true, schema: params } } });
    out.parsed.push({ parsed: r.choices[0].message.parsed, finish: r.choices[0].finish_reason });
    const q = await client.chat.completions.create({ model: "e2e", messages, max_tokens: 1500, temperature: 1, seed,
      tools, tool_choice: "required" });
    out.required.push({ calls: (q.choices[0].message.tool_calls || []).map((c) => ({ name: c.function.name, args: JSON.parse(c.function.arguments) })),
      finish: q.choices[0].finish_reason });
    const n = await client.chat.completions.create({ model: "e2e", messages, max_tokens: 1500, temperature: 1, seed,
      tools, tool_choice: { type: "function", function: { name: "get_weather" } } });
    out.named.push({ calls: (n.choices[0].message.tool_calls || []).map((c) => ({ name: c.function.name, args: JSON.parse(c.function.arguments) })),
      finish: n.choices[0].finish_reason });
  }
  console.log(JSON.stringify(out));
})().catch((e) => { console.error("client failed:", e); process.exit(1); });
`

type weatherCall struct {
	Location string `json:"location"`
	Unit     string `json:"unit"`
	Days     int    `json:"days"`
}

func (w weatherCall) valid() bool {
	return regexp.MustCompile(`^[A-Z][a-z]{1,8}$`).MatchString(w.Location) && (w.Unit == "celsius" || w.Unit == "fahrenheit") && w.Days >= 1 && w.Days <= 14
}

// TestServeStructuredOutputsWithOpenAINodeClient: against resin serve (the built-in test
// runner, random text), the openai npm client's parse() with a json_schema
// response_format and tool_choice "required" and named all return parsed results that
// validate against the schema.
func TestServeStructuredOutputsWithOpenAINodeClient(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed: the openai npm client cannot run")
	}
	modules := os.Getenv("RESIN_OPENAI_NODE_MODULES")
	if modules == "" {
		modules = filepath.Join("..", "..", ".cache", "node-openai", "node_modules")
	}
	if _, err := os.Stat(filepath.Join(modules, "openai", "package.json")); err != nil {
		t.Skipf("the openai npm package is not installed in %s: run .ci/setup.d/31-openai-npm.sh (scripts/test.sh does)", modules)
	}
	modules, _ = filepath.Abs(modules)
	dir := t.TempDir()
	bin := filepath.Join(dir, "resin")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, base, logs := startServer(t, ctx, bin, "serve", "--port", "0", "--served-model-name", "e2e", "--api-key", "e2e-key", "--max-context", "2048")
	go func() {
		for logs.Scan() {
		}
	}()
	script := filepath.Join(dir, "structured.cjs")
	if err := os.WriteFile(script, []byte(structuredScript), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Env = append(os.Environ(), "OPENAI_MODULES="+modules, "BASE_URL="+base)
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("node client: %v\n%s\n%s", err, out, stderr)
	}
	type call struct {
		Name string      `json:"name"`
		Args weatherCall `json:"args"`
	}
	var rep struct {
		Parsed []struct {
			Parsed *weatherCall `json:"parsed"`
			Finish string       `json:"finish"`
		} `json:"parsed"`
		Required, Named []struct {
			Calls  []call `json:"calls"`
			Finish string `json:"finish"`
		}
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("client output %q: %v", out, err)
	}
	if len(rep.Parsed) != 3 || len(rep.Required) != 3 || len(rep.Named) != 3 {
		t.Fatalf("client output %s", out)
	}
	for i := range 3 {
		if p := rep.Parsed[i]; p.Finish != "stop" || p.Parsed == nil || !p.Parsed.valid() {
			t.Errorf("parse() %d: %s", i, out)
		}
		if r := rep.Required[i]; r.Finish != "tool_calls" || len(r.Calls) == 0 || r.Calls[0].Name != "get_weather" || !r.Calls[0].Args.valid() {
			t.Errorf("tool_choice required %d: %+v", i, r)
		}
		if n := rep.Named[i]; n.Finish != "stop" || len(n.Calls) != 1 || n.Calls[0].Name != "get_weather" || !n.Calls[0].Args.valid() {
			t.Errorf("tool_choice named %d: %+v", i, n)
		}
	}
	t.Logf("openai client: %s", strings.TrimSpace(string(out))[:min(300, len(out))])
}
