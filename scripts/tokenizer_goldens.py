"""Writes core/tokenizer goldens from the reference tokenizers and transformers.

Run through scripts/tokenizer-goldens.sh, which installs the pinned packages.
"""
import argparse
import hashlib
import json
import os

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

CORPUS = [
    "",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces and trailing spaces   ",
    "tabs\tand\t\ttabs, newlines\n\n\nand mixed \r\n line ends\r\n",
    "    \n    \t\t   \n",
    "I'm sure they'll say it's DON'T, WE'VE, You'D, she's.",
    "1234567890 3.14159 -42 1e10 0x1F 12,345,678.90 ２０２６年",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "func main() {\n\tfmt.Println(\"héllo\")\n\tfor i := 0; i < 10; i++ {}\n}\n",
    "<html><body class=\"x\">&amp; &lt;tag&gt;</body></html>",
    "中文分词测试：我们今天去北京。日本語のテキスト、カタカナとひらがな。",
    "한국어 텍스트와 Ελληνικά και русский текст, عربي, हिन्दी.",
    "Emoji: 😀🚀👩‍👩‍👧‍👦 🇫🇷 ❤️ and combining: e\u0301 a\u0308 n\u0303 Å vs A\u030a",
    "Ｆｕｌｌｗｉｄｔｈ　ｔｅｘｔ and ﬁ ligature ① ½",
    "URLs: https://example.com/path?q=1&r=two#frag and emails a.b+c@d.org",
    "!!!??? ... --- *** ~~~ ``` $$$ %%% ^^^ ||| \\\\ // <<>>",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "snake_case_identifier camelCaseIdentifier PascalCase SCREAMING_CASE kebab-case",
    "Mixed\u00a0non-breaking\u2009thin\u3000ideographic spaces\u200bzero-width",
    "JSON: {\"a\": [1, 2, {\"b\": null}], \"c\": \"\\u00e9\"}",
]


def specials_corpus(tok):
    """Texts that embed the tokenizer's own added tokens."""
    added = [t for t in tok.get_added_tokens_decoder().values()][:6]
    if not added:
        return []
    out = []
    a = added[0].content
    out.append(f"{a}start")
    out.append("text before " + " ".join(t.content for t in added) + " text after")
    out.append("<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n")
    out.append(f"no space{added[-1].content}no space {a} {a}  spaced")
    return out


CHATS = [
    {"messages": [{"role": "user", "content": "Hello!"}], "add_generation_prompt": True},
    {"messages": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And in words, 中文 please? 😀"},
    ], "add_generation_prompt": True},
    {"messages": [
        {"role": "user", "content": "  Spaces  around  \n"},
        {"role": "assistant", "content": "Trimmed?\n\nTwo paragraphs."},
    ], "add_generation_prompt": False},
    {"messages": [
        {"role": "user", "content": "Think first."},
        {"role": "assistant", "content": "<think>\nSome reasoning.\n</think>\n\nThe answer."},
        {"role": "user", "content": "And now?"},
    ], "add_generation_prompt": True, "kwargs": {"enable_thinking": False}},
    {"messages": [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "Weather in Paris?"},
    ], "add_generation_prompt": True, "tools": [{
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city, in °C.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }]},
]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def golden(name, tok_path, cfg_path, out_dir):
    tok = Tokenizer.from_file(tok_path)
    cases = []
    for text in CORPUS + specials_corpus(tok):
        ids = tok.encode(text, add_special_tokens=False).ids
        ids_special = tok.encode(text, add_special_tokens=True).ids
        cases.append({
            "text": text,
            "ids": ids,
            "ids_add_special": ids_special,
            "decoded": tok.decode(ids, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
        })
    chats = []
    cfg = json.load(open(cfg_path))
    if cfg.get("chat_template"):
        hf = AutoTokenizer.from_pretrained(os.path.dirname(cfg_path))
        for chat in CHATS:
            prompt = hf.apply_chat_template(chat["messages"], tokenize=False, tools=chat.get("tools"),
                                            add_generation_prompt=chat["add_generation_prompt"],
                                            **chat.get("kwargs", {}))
            chats.append({**chat, "prompt": prompt,
                          "ids": tok.encode(prompt, add_special_tokens=False).ids})
        special = dict(hf.special_tokens_map)
        for chat in render_tool_chats(cfg["chat_template"], special):
            chats.append({**chat, "ids": tok.encode(chat["prompt"], add_special_tokens=False).ids})
    doc = {
        "name": name,
        "tokenizer_sha256": sha256(tok_path),
        "reference": "tokenizers %s, transformers %s" % (
            __import__("tokenizers").__version__, __import__("transformers").__version__),
        "cases": cases,
        "chats": chats,
    }
    with open(os.path.join(out_dir, name + ".golden.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{name}: {len(cases)} cases, {len(chats)} chats")


# Jinja semantics the chat templates rely on, rendered by Python Jinja2 in transformers'
# environment; core/tokenizer's TestJinjaMatchesPython renders them with the Go engine.
JINJA_CASES = [
 "{{ 3*'ab' }}", "{{ 'ab'*3 }}", "{{ -7//2 }}", "{{ 7//-2 }}", "{{ -7 % 3 }}", "{{ 7/2 }}", "{{ 4/2 }}", "{{ 1.0 }}", "{{ 0.1+0.2 }}", "{{ 1e3 }}", "{{ 1E-5 }}", "{{ 1e16 }}", "{{ 2.5e-3 }}", "{{ 123456789.0*1000000000 }}",
 "{{ none }}", "{{ None }}", "{{ x is none }}", "{{ 'abc' is sequence }}", "{{ [1] is sequence }}", "{{ {} is sequence }}", "{{ 5 is sequence }}",
 "{{ '\\u00e9\\n\\t\\x41' }}", "{{ \"caf\\u00e9 \\U0001F600\" }}",
 "{{ -3|abs }}", "{{ -2.5|abs }}", "{{ [1,2,3]|join(', ') }}", "{{ [1,none,'a']|join }}", "{{ 'abc'|join('-') }}", "{{ [{'a':1},{'a':2}]|join(',', attribute='a') }}",
 "{{ '%s-%d'|format('a', 3) }}", "{{ '%05.2f|%x|%r'|format(3.14159, 255, 'q') }}", "{{ 'ab'|center(7) }}", "{{ 'ab'|center(7, '*') if false else 'ab'|center(8) }}",
 "{{ [1, 2.0, 'a', none, true] }}", "{{ {'a': 1, 'b': [none]} }}", "{{ true }}", "{{ 10**20 }}", "{{ 2**0.5 }}", "{{ 1/3 }}",
 "{{ {'b':1,'a':'<x>'}|tojson }}", "{{ {'b':1,'a':'<x>', 'c': [1.0, 1e5, 12345678901234567890123]}|tojson(indent=2) }}",
 "{{ 'é'|tojson }}", "{{ 1e100|tojson }}",
 "{{ x|tojson }}", "{{ x.c|tojson }}", "{{ x }}", "{{ x.c[0] }}", "{{ x.c[1] }}", "{{ x.c[2] }}", "{{ x.c[2] + 1 }}",
 "{{ 'a,b'.split(',') }}", "{{ 3.0|int }}", "{{ '3'|int + 1 }}", "{{ 3|float }}", "{{ 2.675|round(2) }}", "{{ 2.5|round }}", "{{ [3,1,2]|sort }}", "{{ 'x'|string }}", "{{ 1 == 1.0 }}", "{{ 17 // 5.0 }}", "{{ -7.5 // 2 }}", "{{ 7 % -3 }}", "{{ 'Hello'[1:3] }}", "{{ 'ab' ~ 1.5 }}", "{{ [1]*3 }}", "{{ 1e3|int }}", "{{ '{:d}'.format(3) if false else 'ok' }}",
 "{{ x|tojson(indent=4) }}", "{{ x|tojson(separators=(',', ':')) }}", "{{ {'k': [], 'e': {}}|tojson(indent=2) }}", "{{ 'a\\u2028\\x01\"'|tojson }}",
 "{{ 1/0 }}", "{{ 1//0 }}", "{{ '%s and %s' % ('a', 'b') }}", "{{ 7 % 2 }}", "{{ [] is sequence }}",
 "{% for k, v in x|items %}{{ k }}={{ v }};{% endfor %}",
 "{{ {'a': 1}.items()|list }}", "{{ 10 is divisibleby 5 }}", "{{ 3 is odd and true }}", "{{ 'a' is sameas 'a' }}", "{{ 2 is even }}", "{{ 10 is divisibleby(3) }}", "{{ undefined_var|default('d') }}",
 "{{ none|default('d') }}", "{{ none|default('d', true) }}", "{{ '%.2f'|format(1.005) }}", "{{ 3.0 }}", "{{ 1e-7 }}", "{{ -0.0 }}",
 "{{ 2**-1 }}", "{{ 10/4 }}", "{{ 10//4 }}", "{{ 2**62*4 }}", "{{ -2**2 }}", "{{ 'a' in 'abc' }}", "{{ 1 in [1,2] }}",
 "{{ 'k' in {'k':1} }}", "{{ [1,2,3]|sum }}", "{{ [1.5,2]|sum }}", "{{ [3,1,2]|max }}", "{{ ['b','a']|min }}",
 "{{ 'hello world'|capitalize }}", "{{ 'hello world'|title }}", "{{ [1,2]|reverse|list }}", "{{ 'abc'|reverse }}",
 "{{ [1,[2,3]]|tojson }}", "{{ true|tojson }}", "{{ none|tojson }}", "{{ 'a\"b\\\\c'|tojson }}", "{{ 1 if none else 2 }}",
 "{{ '' or 'x' }}", "{{ 0 and 1 }}", "{{ 'abc'.upper() }}", "{{ ' a '.strip() }}", "{{ 'a-b'.split('-')[1] }}",
 "{{ 'x{}'.format(1) }}", "{{ 'abc'.title() }}", "{{ range(3)|list }}", "{{ dict(a=1) }}", "{{ {'b': 1, 'a': 2}|dictsort }}",
 "{{ [1,2,3]|batch(2)|list }}", "{{ '3.5'|float }}", "{{ 'x'|int }}", "{{ 3.7|int }}", "{{ -3.7|int }}", "{{ 1.5|round }}",
 "{{ 0.5|round }}", "{{ 1.25|round(1) }}", "{{ 'é😀'|length }}", "{{ 'ab'[5:] }}",
 "{{ x.a is float }}", "{{ x.c[2] is integer }}", "{{ true is number }}", "{{ x is mapping }}", "{{ 'ab' is iterable }}",
 "{{ 3 > 2.5 }}", "{{ 'b' > 'a' }}", "{{ x.c[2] > 10 }}", "{{ 1e309 }}", "{{ [1, 'a'] ~ '' }}", "{{ 'a' ~ none }}",
 "{{ x.b|e }}", "{{ '<p>'|escape }}", "{{ 'a\nb'|indent(2, true) }}", "{{ [none, 1]|select|list }}", "{{ [0, 1, 2]|reject('odd')|list }}",
 "{{ [{'n': 'a'}, {'n': 'b'}]|map(attribute='n')|join }}", "{{ ['1', '2']|map('int')|sum }}", "{{ x.c|unique|list|length }}",
 "{{ 'abc'|wordcount }}", "{{ 'Hello'|lower|first }}", "{{ [1,2,3]|last }}", "{{ x|length }}", "{{ 'a,b'|replace(',', ';') }}",
 "{{ c|length }}{% for p in c %}{{ p.type }}:{{ p.text }};{% endfor %}", "{{ c }}",
]

# JINJA_DATA is JSON text so that the numbers' spelling (1E5, 1.0, big integers) reaches
# both engines as a request body would.
JINJA_DATA = ('{"x": {"a": 1.0, "b": "<&>", "c": [1.0, 1E5, 12345678901234567890123], "d": -0.0},'
              ' "c": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "u"}}]}')


def jinja_golden(out_dir):
    from transformers.utils.chat_template_utils import _compile_jinja_template
    data = json.loads(JINJA_DATA)
    cases = []
    for src in JINJA_CASES:
        try:
            want = _compile_jinja_template(src).render(**data)
        except Exception as e:  # the Go side must fail too
            want = "ERROR: " + type(e).__name__
        cases.append({"template": src, "want": want})
    doc = {"reference": "jinja2 %s, transformers %s" % (
        __import__("jinja2").__version__, __import__("transformers").__version__),
        "data": JINJA_DATA, "cases": cases}
    with open(os.path.join(out_dir, "jinja.golden.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"jinja: {len(cases)} cases")


# Tool-calling conversations. Tools and messages are JSON text, parsed here as a server
# parses a request, so numbers keep the spelling a client sends (1.0, 1E5, integers past
# int64) and the Go side reads the same text.
TOOLS_JSON = """[
 {"type": "function", "function": {"name": "get_weather",
  "description": "Current weather for a city, in °C. Use it when 0 < days < 8 & the user asks.",
  "parameters": {"type": "object", "properties": {
   "city": {"type": "string", "description": "City name, e.g. <Paris>"},
   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
   "days": {"type": "integer", "minimum": 1, "maximum": 1E5, "default": 1.0}},
   "required": ["city"]}}},
 {"type": "function", "function": {"name": "search",
  "description": "Search the <web> for \\"quoted\\" text.",
  "parameters": {"type": "object", "properties": {
   "query": {"type": "string"},
   "filters": {"type": "object", "properties": {
    "max_id": {"type": "integer", "maximum": 12345678901234567890123},
    "score": {"type": "number", "minimum": 0.0, "maximum": 2.5e-3},
    "tags": {"type": "array", "items": {"type": "string"}}}}},
   "required": ["query"]}}}
]"""


def tool_call_messages(arguments_as_string):
    args = '{"city": "Paris", "days": 3, "unit": "celsius"}'
    if arguments_as_string:
        args = json.dumps(args)
    return """[
 {"role": "system", "content": "You can call tools."},
 {"role": "user", "content": "Weather in Paris for 3 days, and search <news>?"},
 {"role": "assistant", "content": "", "tool_calls": [
  {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": %s}},
  {"id": "call_2", "type": "function", "function": {"name": "search", "arguments": %s}}]},
 {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\\"temp\\": 21.5, \\"sky\\": \\"clear\\"}"},
 {"role": "tool", "tool_call_id": "call_2", "name": "search", "content": "No <news> today."},
 {"role": "assistant", "content": "It is 21.5 °C and clear; no news."},
 {"role": "user", "content": "Thanks!"}
]""" % (args, json.dumps('{"query": "news", "filters": {"score": 1.0}}') if arguments_as_string
         else '{"query": "news", "filters": {"score": 1.0}}')


TOOL_CHATS = [
    {"messages_json": '[{"role": "user", "content": "Weather in Paris?"}]', "tools_json": TOOLS_JSON,
     "add_generation_prompt": True},
    {"messages_json": tool_call_messages(False), "tools_json": TOOLS_JSON, "add_generation_prompt": True},
    {"messages_json": tool_call_messages(True), "tools_json": TOOLS_JSON, "add_generation_prompt": True},
    # As vLLM renders it: arguments strings decoded to mappings (DecodeToolArguments).
    {"messages_json": tool_call_messages(True), "tools_json": TOOLS_JSON, "add_generation_prompt": True,
     "decode_tool_arguments": True},
    {"messages_json": """[{"role": "user", "content": "Weather in Oslo?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_8", "type": "function",
       "function": {"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\", \\"days\\": 1E5, \\"id\\": 12345678901234567890123}"}}]},
      {"role": "tool", "tool_call_id": "call_8", "content": "-3 °C"}]""", "tools_json": TOOLS_JSON,
     "add_generation_prompt": True, "decode_tool_arguments": True},
    {"messages_json": """[{"role": "user", "content": "Weather in Oslo?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_9", "type": "function",
       "function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 1E5, "ratio": 1.0, "id": 12345678901234567890123}}}]},
      {"role": "tool", "tool_call_id": "call_9", "content": "-3 °C <snow>"}]""", "tools_json": TOOLS_JSON,
     "add_generation_prompt": True},
    {"messages_json": """[{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
      {"role": "user", "content": [{"type": "text", "text": "Describe this:"}, {"type": "text", "text": "a <b> tag."}]}]""",
     "add_generation_prompt": True},
    {"messages_json": """[{"role": "user", "content": "2+2?"},
      {"role": "assistant", "content": "4", "reasoning_content": "Two plus two is four."},
      {"role": "user", "content": "3+3?"}]""", "add_generation_prompt": True},
]

# vLLM's rule for content given as a list of parts: a template that loops over a
# message's content gets the list ("openai"), any other gets the text parts joined with
# newlines ("string"). core/tokenizer's ContentFormat implements the same test.
OPENAI_CONTENT = __import__("re").compile(
    r"""\{%-?\s*for\s+\w+\s+in\s+\w+(?:\.content\b|\[\s*['"]content['"]\s*\])""")


def content_format(template):
    return "openai" if OPENAI_CONTENT.search(template) else "string"


def flatten_content(messages, fmt):
    if fmt == "openai":
        return messages
    out = []
    for m in messages:
        if isinstance(m.get("content"), list):
            m = {**m, "content": "\n".join(p["text"] for p in m["content"] if p.get("type") == "text")}
        out.append(m)
    return out


def decode_tool_arguments(messages):
    """vLLM's _postprocess_messages: assistant tool calls' arguments as mappings."""
    out = []
    for m in messages:
        if m.get("role") == "assistant" and isinstance(m.get("tool_calls"), list):
            m = dict(m)
            if not m["tool_calls"]:
                del m["tool_calls"]
            else:
                calls = []
                for c in m["tool_calls"]:
                    fn = dict(c["function"])
                    args = fn.get("arguments")
                    if isinstance(args, str):
                        try:
                            args = json.loads(args)
                        except json.JSONDecodeError:
                            args = None
                    fn["arguments"] = args if isinstance(args, dict) else {}
                    calls.append({**c, "function": fn})
                m["tool_calls"] = calls
        out.append(m)
    return out


# The day strftime_now reads while rendering, so templates that print today's date
# (Mistral, gpt-oss) give goldens that hold on any day: core/tokenizer's golden test
# renders with the same clock (goldenNow). transformers' strftime_now calls its module's
# datetime.now(), so that is what is pinned.
GOLDEN_DATE = (2026, 11, 30, 12, 0, 0)


def pin_template_clock():
    import datetime
    from transformers.utils import chat_template_utils

    class GoldenDatetime(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(*GOLDEN_DATE, tzinfo=tz)

    chat_template_utils.datetime = GoldenDatetime


def render_tool_chats(template, special, kwargs=None):
    """Renders TOOL_CHATS with transformers' render_jinja_template; chats the template
    rejects (raise_exception, a string concatenated to a dict) are left out."""
    from transformers.utils.chat_template_utils import render_jinja_template
    pin_template_clock()
    fmt = content_format(template)
    out = []
    for chat in TOOL_CHATS:
        messages = flatten_content(json.loads(chat["messages_json"]), fmt)
        if chat.get("decode_tool_arguments"):
            messages = decode_tool_arguments(messages)
        tools = json.loads(chat["tools_json"]) if "tools_json" in chat else None
        kw = {**special, **(kwargs or {})}
        try:
            prompt = render_jinja_template([messages], tools=tools, chat_template=template,
                                           add_generation_prompt=chat["add_generation_prompt"], **kw)[0][0]
        except Exception as e:
            print(f"   left out (Python: {type(e).__name__}: {e})")
            continue
        out.append({**chat, "kwargs": kwargs or {}, "content_format": fmt, "prompt": prompt})
    return out


# Real chat templates of tool-calling models, from the testdata of github.com/ardanlabs/jinja
# v1.8.0 (copied there from the models' GGUF files), kept in core/tokenizer/testdata/templates.
def template_goldens(out_dir):
    tdir = os.path.join(out_dir, "templates")
    special = {"bos_token": "<|bos|>", "eos_token": "<|eos|>"}
    for fname in sorted(os.listdir(tdir)):
        if not fname.endswith(".jinja"):
            continue
        src = open(os.path.join(tdir, fname), encoding="utf-8").read()
        name = fname[:-len(".jinja")]
        print(name)
        kwargs = {"date_string": "26 Jul 2024"}
        chats = render_tool_chats(src, special, kwargs)
        doc = {"template": fname, "template_sha256": hashlib.sha256(src.encode()).hexdigest(),
               "reference": "transformers %s" % __import__("transformers").__version__,
               "special_tokens": special, "chats": chats}
        with open(os.path.join(out_dir, name + ".template.golden.json"), "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(f"{name}: {len(chats)} chats")


TINY_TEMPLATE = (
    "{%- if messages[0].role != 'system' %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content | trim + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def train_tiny(path):
    """Trains the small byte-level BPE that ships in testdata (our own, from our corpus)."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.Split(pattern=__import__("tokenizers").Regex(LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>"]
    trainer = trainers.BpeTrainer(vocab_size=1024, min_frequency=1, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    text = [open(os.path.abspath(__file__), encoding="utf-8").read()] * 5
    text += CORPUS * 20
    tok.train_from_iterator(text, trainer=trainer)
    tok.add_tokens([__import__("tokenizers").AddedToken("<tool>", lstrip=True, rstrip=True, normalized=False)])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)])
    os.makedirs(path, exist_ok=True)
    tok.save(os.path.join(path, "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
           "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": TINY_TEMPLATE,
           "model_max_length": 4096}
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
        f.write("\n")


def train_gpt2style(path):
    """Trains a GPT-2-style tokenizer: ByteLevel pre-tokenizer with its own regex and a
    prefix space, no normalizer, merges saved as "a b" strings."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(vocab_size=800, min_frequency=1, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    text = [open(os.path.abspath(__file__), encoding="utf-8").read()] * 5 + CORPUS * 20
    tok.train_from_iterator(text, trainer=trainer)
    os.makedirs(path, exist_ok=True)
    out = os.path.join(path, "tokenizer.json")
    tok.save(out)
    doc = json.load(open(out, encoding="utf-8"))
    doc["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in doc["model"]["merges"]]
    with open(out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "GPT2Tokenizer", "eos_token": "<|endoftext|>"}, f, indent=1)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizers", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tiny", required=True)
    ap.add_argument("--retrain", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    jinja_golden(a.out)
    template_goldens(a.out)
    tiny = a.tiny
    if a.retrain or not os.path.exists(os.path.join(tiny, "tokenizer.json")):
        train_tiny(tiny)
    golden("tiny", os.path.join(tiny, "tokenizer.json"), os.path.join(tiny, "tokenizer_config.json"), a.out)
    g2 = os.path.join(a.out, "gpt2style")
    if a.retrain or not os.path.exists(os.path.join(g2, "tokenizer.json")):
        train_gpt2style(g2)
    golden("gpt2style", os.path.join(g2, "tokenizer.json"), os.path.join(g2, "tokenizer_config.json"), a.out)
    for name in sorted(os.listdir(a.tokenizers)):
        d = os.path.join(a.tokenizers, name)
        golden(name, os.path.join(d, "tokenizer.json"), os.path.join(d, "tokenizer_config.json"), a.out)


if __name__ == "__main__":
    main()
