// Oracle for the C++ Jinja interpreter: renders chat templates with @huggingface/jinja.
// Usage: node render_template.mjs REQUEST.json
//   REQUEST = {"template": "...", "contexts": [{...variables...}, ...]}
//          or {"cases": [{"template": "...", "context": {...}}, ...]}
// Prints a JSON array with, per context, {"ok": true, "text": "..."} or {"ok": false, "error": "..."}.
// Exits 2 with a clear message when @huggingface/jinja is not installed.
import { readFileSync } from "node:fs";

let Template;
try {
  ({ Template } = await import("@huggingface/jinja"));
} catch (e) {
  console.error("render_template.mjs: @huggingface/jinja is not installed (run `npm ci` in tests/oracles): " + e.message);
  process.exit(2);
}
const request = JSON.parse(readFileSync(process.argv[2], "utf8"));
const cases = request.cases ?? request.contexts.map((context) => ({ template: request.template, context }));
const results = cases.map(({ template, context }) => {
  try {
    return { ok: true, text: new Template(template).render(context) };
  } catch (e) {
    return { ok: false, error: String(e.message ?? e) };
  }
});
process.stdout.write(JSON.stringify(results));
