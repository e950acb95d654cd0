"""Oracle for the C++ Jinja interpreter: renders chat templates with Python's Jinja2, set up as
Hugging Face transformers' apply_chat_template sets it up (transformers/utils/chat_template_utils.py,
_compile_jinja_template): ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
extensions=[loopcontrols]), a tojson filter that is json.dumps(ensure_ascii=False) (no HTML escaping,
returns a plain str), raise_exception and strftime_now globals.

Usage: /usr/bin/python3 render_jinja2.py REQUEST.json
  REQUEST = {"cases": [{"template": "...", "context": {...}}, ...], "now_epoch_s": optional}
  A case may give a dataset row instead of a context (tool-calling data, issue 43):
    {"template": "...", "row": {"messages": [...], "tools": ..., "chat_template_kwargs": ...},
     "special_tokens": {"bos_token": ..., "eos_token": ...}, "template_kwargs": {...},
     "add_generation_prompt": false, "tool_arguments": "object"|"string", "default_tools": [...] or null}
  It is rendered as a TRL user renders an OpenAI-format row with apply_chat_template(messages,
  tools=row tools or default_tools, **template_kwargs, **row chat_template_kwargs), after the
  normalization backprop documents (README "Tool calls and reasoning"): keys whose value is None are
  left out (content excepted) and so is an empty tool_calls list; a tool call's arguments are parsed
  from their JSON string (json.loads; blank = {}) for "object", written with json.dumps for "string";
  a tools column stored as a JSON string is parsed.
Prints a JSON array with, per case, {"ok": true, "text": "..."} or {"ok": false, "error": "..."}.
Exits 2 with a clear message when Jinja2 is not installed (Debian: python3-jinja2).
"""
import json
import sys
from datetime import datetime

try:
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError as e:
    sys.stderr.write(f"render_jinja2.py: Jinja2 is not installed (apt-get install python3-jinja2): {e}\n")
    sys.exit(2)


class AssistantTracker(jinja2.ext.Extension):
    """transformers' {% generation %} block, rendering its body (the spans are not needed here)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env(now_epoch_s):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        now = datetime.fromtimestamp(now_epoch_s) if now_epoch_s is not None else datetime.now()
        return now.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def row_context(case):
    """The keyword arguments apply_chat_template renders a row with (see the module docstring)."""
    row = case["row"]
    mode = case.get("tool_arguments", "object")
    messages = []
    for m in row["messages"]:
        m = {k: v for k, v in m.items() if v is not None or k == "content"}
        if "tool_calls" in m and not m["tool_calls"]:
            del m["tool_calls"]
        if "tool_calls" in m:
            calls = []
            for call in m["tool_calls"]:
                call = {k: v for k, v in call.items() if v is not None}
                if "function" in call:
                    call["function"] = {k: v for k, v in call["function"].items() if v is not None}
                fn = call.get("function", call)
                args = fn["arguments"]
                if mode == "object" and isinstance(args, str):
                    fn["arguments"] = json.loads(args) if args.strip() else {}
                elif mode == "string" and isinstance(args, dict):
                    fn["arguments"] = json.dumps(args, ensure_ascii=False)
                calls.append(call)
            m["tool_calls"] = calls
        messages.append(m)
    tools = row.get("tools")
    if isinstance(tools, str):
        tools = json.loads(tools)
    if tools is None:
        tools = case.get("default_tools")
    # transformers: render(messages=..., tools=..., documents=..., add_generation_prompt=...,
    # **{**special_tokens_map, **kwargs}); TRL adds the row's chat_template_kwargs to kwargs.
    kwargs = dict(case.get("special_tokens", {}))
    kwargs.update(case.get("template_kwargs") or {})
    kwargs.update(row.get("chat_template_kwargs") or {})
    return dict(messages=messages, tools=tools, documents=None,
                add_generation_prompt=case.get("add_generation_prompt", False), **kwargs)


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        request = json.load(f)
    env = make_env(request.get("now_epoch_s"))
    results = []
    for case in request["cases"]:
        try:
            context = row_context(case) if "row" in case else case["context"]
            text = env.from_string(case["template"]).render(**context)
            results.append({"ok": True, "text": text})
        except Exception as e:  # the template raised: the C++ side must raise too
            results.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
    sys.stdout.write(json.dumps(results, ensure_ascii=False))


if __name__ == "__main__":
    main()
