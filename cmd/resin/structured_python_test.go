package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// structuredPythonScript asks for structured outputs the way Python users do: the openai
// SDK's parse() with a pydantic model as response_format (a strict json_schema) and tools
// with tool_choice "required", and LangChain's ChatOpenAI with_structured_output(model)
// and bind_tools([model], tool_choice=name); it prints what each client returned.
const structuredPythonScript = `
import json, os
from typing import Literal
from pydantic import BaseModel, Field
from openai import OpenAI
from langchain_openai import ChatOpenAI


class Weather(BaseModel):
    """Weather in a city."""
    location: str = Field(pattern=r"^[A-Z][a-z]{1,8}$")
    unit: Literal["celsius", "fahrenheit"]
    days: int = Field(ge=1, le=14)


base = os.environ["BASE_URL"] + "/v1"
client = OpenAI(base_url=base, api_key="e2e-key", max_retries=0)
messages = [{"role": "user", "content": "Weather in Paris?"}]
tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather",
        "parameters": Weather.model_json_schema()}}
out = {"sdk_parse": [], "sdk_required": [], "lc_structured": [], "lc_tools": []}
for seed in range(3):
    r = client.chat.completions.parse(model="e2e", messages=messages, max_tokens=1500,
                                      temperature=1, seed=seed, response_format=Weather)
    c = r.choices[0]
    out["sdk_parse"].append({"parsed": c.message.parsed.model_dump() if c.message.parsed else None,
                             "finish": c.finish_reason})
    q = client.chat.completions.create(model="e2e", messages=messages, max_tokens=1500,
                                       temperature=1, seed=seed, tools=[tool], tool_choice="required")
    c = q.choices[0]
    out["sdk_required"].append({"calls": [{"name": t.function.name, "args": json.loads(t.function.arguments)}
                                          for t in (c.message.tool_calls or [])], "finish": c.finish_reason})
    llm = ChatOpenAI(base_url=base, api_key="e2e-key", model="e2e", temperature=1, max_tokens=1500,
                     seed=seed, max_retries=0)
    w = llm.with_structured_output(Weather).invoke("Weather in Paris?")
    out["lc_structured"].append({"parsed": w.model_dump(), "type": type(w).__name__})
    m = llm.bind_tools([Weather], tool_choice="Weather").invoke("Weather in Paris?")
    out["lc_tools"].append({"calls": [{"name": t["name"], "args": t["args"]} for t in m.tool_calls],
                            "invalid": len(m.invalid_tool_calls)})
print(json.dumps(out))
`

// runPythonClients runs script with the Python from .ci/setup.d/41-python-openai.sh
// (openai, langchain-openai, pydantic) against a fresh resin serve of the built-in test
// runner (served as "e2e", API key "e2e-key", BASE_URL in the script's environment) and
// returns what it printed; it skips without that Python.
func runPythonClients(t *testing.T, script string) []byte {
	t.Helper()
	py := os.Getenv("RESIN_OPENAI_PYTHON")
	if py == "" {
		py = filepath.Join("..", "..", ".cache", "openai-venv", "bin", "python")
	}
	if _, err := os.Stat(py); err != nil {
		t.Skipf("no Python with openai and langchain-openai at %s: run .ci/setup.d/41-python-openai.sh (scripts/test.sh does)", py)
	}
	if out, err := exec.Command(py, "-c", "import openai, langchain_openai, pydantic").CombinedOutput(); err != nil {
		t.Skipf("%s cannot import openai, langchain_openai and pydantic (run .ci/setup.d/41-python-openai.sh): %v\n%s", py, err, out)
	}
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
	file := filepath.Join(dir, "clients.py")
	if err := os.WriteFile(file, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, py, file)
	// No proxy and no telemetry: the clients talk to the local server only.
	cmd.Env = append(os.Environ(), "BASE_URL="+base, "NO_PROXY=127.0.0.1,localhost", "LANGCHAIN_TRACING_V2=false", "LANGSMITH_TRACING=false")
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("python clients: %v\n%s\n%s", err, out, stderr)
	}
	return out
}

// TestServeStructuredOutputsWithPythonClients: against resin serve (the built-in test
// runner, random text), Python's openai SDK (parse() with a pydantic response_format,
// tool_choice "required") and LangChain (with_structured_output of a pydantic model,
// bind_tools with a named tool_choice) all return parsed results that validate against
// the model's schema. The clients come from .ci/setup.d/41-python-openai.sh.
func TestServeStructuredOutputsWithPythonClients(t *testing.T) {
	out := runPythonClients(t, structuredPythonScript)
	type call struct {
		Name string      `json:"name"`
		Args weatherCall `json:"args"`
	}
	var rep struct {
		SDKParse []struct {
			Parsed *weatherCall `json:"parsed"`
			Finish string       `json:"finish"`
		} `json:"sdk_parse"`
		SDKRequired []struct {
			Calls  []call `json:"calls"`
			Finish string `json:"finish"`
		} `json:"sdk_required"`
		LCStructured []struct {
			Parsed *weatherCall `json:"parsed"`
			Type   string       `json:"type"`
		} `json:"lc_structured"`
		LCTools []struct {
			Calls   []call `json:"calls"`
			Invalid int    `json:"invalid"`
		} `json:"lc_tools"`
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("client output %q: %v", out, err)
	}
	if len(rep.SDKParse) != 3 || len(rep.SDKRequired) != 3 || len(rep.LCStructured) != 3 || len(rep.LCTools) != 3 {
		t.Fatalf("client output %s", out)
	}
	for i := range 3 {
		if p := rep.SDKParse[i]; p.Finish != "stop" || p.Parsed == nil || !p.Parsed.valid() {
			t.Errorf("openai parse() %d: %+v", i, p)
		}
		r := rep.SDKRequired[i]
		if r.Finish != "tool_calls" || len(r.Calls) == 0 {
			t.Errorf("openai tool_choice required %d: %+v", i, r)
		}
		for _, c := range r.Calls {
			if c.Name != "get_weather" || !c.Args.valid() {
				t.Errorf("openai tool_choice required %d: call %+v", i, c)
			}
		}
		if s := rep.LCStructured[i]; s.Type != "Weather" || s.Parsed == nil || !s.Parsed.valid() {
			t.Errorf("langchain with_structured_output %d: %+v", i, s)
		}
		if b := rep.LCTools[i]; b.Invalid != 0 || len(b.Calls) != 1 || b.Calls[0].Name != "Weather" || !b.Calls[0].Args.valid() {
			t.Errorf("langchain bind_tools tool_choice %d: %+v", i, b)
		}
	}
	t.Logf("python clients: %s", strings.TrimSpace(string(out))[:min(300, len(out))])
}
