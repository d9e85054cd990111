package main

import (
	"encoding/json"
	"testing"
)

// responsesPythonScript calls /v1/responses the way Python users do: the openai SDK's
// responses.create (instructions, max_output_tokens), responses.stream, responses.parse
// with a pydantic text_format, function tools with tool_choice "required", and LangChain's
// ChatOpenAI with use_responses_api (invoke, stream, with_structured_output, bind_tools).
const responsesPythonScript = `
import json, os
from typing import Literal
from pydantic import BaseModel, Field
from openai import OpenAI
from langchain_openai import ChatOpenAI


class Weather(BaseModel):
    location: str = Field(pattern=r"^[A-Z][a-z]{1,8}$")
    unit: Literal["celsius", "fahrenheit"]
    days: int = Field(ge=1, le=14)


base = os.environ["BASE_URL"] + "/v1"
c = OpenAI(base_url=base, api_key="e2e-key", max_retries=0)
out = {}
r = c.responses.create(model="e2e", input="Hello", instructions="Be brief", max_output_tokens=8, temperature=0)
out["create"] = {"status": r.status, "text": r.output_text, "out": r.usage.output_tokens,
                 "reason": r.incomplete_details.reason if r.incomplete_details else None}
with c.responses.stream(model="e2e", input="Hello", instructions="Be brief", max_output_tokens=8, temperature=0) as s:
    deltas = "".join(ev.delta for ev in s if ev.type == "response.output_text.delta")
    f = s.get_final_response()
out["stream"] = {"deltas": deltas, "text": f.output_text, "status": f.status}
p = c.responses.parse(model="e2e", input="Weather?", text_format=Weather, max_output_tokens=300, temperature=1, extra_body={"seed": 1})
out["parse"] = p.output_parsed.model_dump() if p.output_parsed else None
tools = [{"type": "function", "name": "get_weather", "parameters": Weather.model_json_schema()}]
t = c.responses.create(model="e2e", input="Weather?", tools=tools, tool_choice="required", max_output_tokens=800,
                       temperature=1, extra_body={"seed": 2})
out["calls"] = [{"name": o.name, "args": json.loads(o.arguments)} for o in t.output if o.type == "function_call"]
llm = ChatOpenAI(base_url=base, api_key="e2e-key", model="e2e", use_responses_api=True, max_tokens=300,
                 temperature=1, max_retries=0)
m = llm.invoke("Hello")
out["lc_text"] = m.text
out["lc_stream"] = "".join(ch.text for ch in llm.stream("Hello"))
out["lc_structured"] = llm.with_structured_output(Weather).invoke("Weather?").model_dump()
b = llm.bind_tools([Weather], tool_choice="Weather").invoke("Weather?")
out["lc_tools"] = [{"name": x["name"], "args": x["args"]} for x in b.tool_calls]
print(json.dumps(out))
`

// TestServeResponsesWithPythonClients: the openai SDK's and LangChain's Responses API
// calls work against resin serve: text (cut at max_output_tokens: "incomplete"), a stream
// whose deltas are the final text, parsed pydantic outputs and function calls that
// validate. Before, /v1/responses was 404 and use_responses_api clients failed.
func TestServeResponsesWithPythonClients(t *testing.T) {
	out := runPythonClients(t, responsesPythonScript)
	type call struct {
		Name string      `json:"name"`
		Args weatherCall `json:"args"`
	}
	var rep struct {
		Create struct {
			Status, Text, Reason string
			Out                  int
		}
		Stream       struct{ Deltas, Text, Status string }
		Parse        *weatherCall `json:"parse"`
		Calls        []call       `json:"calls"`
		LCText       string       `json:"lc_text"`
		LCStream     string       `json:"lc_stream"`
		LCStructured *weatherCall `json:"lc_structured"`
		LCTools      []call       `json:"lc_tools"`
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("client output %q: %v", out, err)
	}
	if rep.Create.Text == "" || rep.Create.Out != 8 || rep.Create.Status != "incomplete" || rep.Create.Reason != "max_output_tokens" {
		t.Errorf("responses.create: %+v", rep.Create)
	}
	if rep.Stream.Deltas != rep.Stream.Text || rep.Stream.Text != rep.Create.Text || rep.Stream.Status != "incomplete" {
		t.Errorf("responses.stream: %+v, create gave %q", rep.Stream, rep.Create.Text)
	}
	if rep.Parse == nil || !rep.Parse.valid() {
		t.Errorf("responses.parse: %+v", rep.Parse)
	}
	if len(rep.Calls) == 0 {
		t.Errorf("tool_choice required: no calls")
	}
	for _, c := range append(rep.Calls, rep.LCTools...) {
		if (c.Name != "get_weather" && c.Name != "Weather") || !c.Args.valid() {
			t.Errorf("call %+v", c)
		}
	}
	if rep.LCText == "" || rep.LCStream == "" || rep.LCStructured == nil || !rep.LCStructured.valid() || len(rep.LCTools) != 1 {
		t.Errorf("LangChain use_responses_api: %s", out)
	}
}
