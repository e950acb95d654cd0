"""Oracle for the C++ Jinja interpreter: renders chat templates with Python's Jinja2, set up as
Hugging Face transformers' apply_chat_template sets it up (transformers/utils/chat_template_utils.py,
_compile_jinja_template): ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
extensions=[loopcontrols]), a tojson filter that is json.dumps(ensure_ascii=False) (no HTML escaping,
returns a plain str), raise_exception and strftime_now globals.

Usage: /usr/bin/python3 render_jinja2.py REQUEST.json
  REQUEST = {"cases": [{"template": "...", "context": {...}}, ...], "now_epoch_s": optional}
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


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        request = json.load(f)
    env = make_env(request.get("now_epoch_s"))
    results = []
    for case in request["cases"]:
        try:
            text = env.from_string(case["template"]).render(**case["context"])
            results.append({"ok": True, "text": text})
        except Exception as e:  # the template raised: the C++ side must raise too
            results.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
    sys.stdout.write(json.dumps(results, ensure_ascii=False))


if __name__ == "__main__":
    main()
