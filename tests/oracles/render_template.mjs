// Oracle for the C++ Jinja interpreter: renders chat templates with @huggingface/jinja.
// Usage: node render_template.mjs REQUEST.json
//   REQUEST = {"template": "...", "contexts": [{...variables...}, ...]}
//          or {"cases": [{"template": "...", "context": {...}}, ...]}
//   An optional "now_epoch_s" in the request fixes the clock strftime_now reads (local time, as the
//   C++ renderer's now_epoch_s), so templates that print today's date render reproducibly.
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
if (request.now_epoch_s !== undefined) {
  // strftime_now() calls `new Date()`: a Date whose no-argument form is the fixed instant.
  const RealDate = Date;
  const fixed_ms = request.now_epoch_s * 1000;
  globalThis.Date = class extends RealDate {
    constructor(...args) {
      super(...(args.length ? args : [fixed_ms]));
    }
    static now() {
      return fixed_ms;
    }
  };
  // %b / %B use Intl's default locale: pin English month names, as C's strftime prints them.
  const RealDateTimeFormat = Intl.DateTimeFormat;
  Intl.DateTimeFormat = function (locale, options) {
    return new RealDateTimeFormat(locale ?? "en-US", options);
  };
}
const cases = request.cases ?? request.contexts.map((context) => ({ template: request.template, context }));
const results = cases.map(({ template, context }) => {
  try {
    return { ok: true, text: new Template(template).render(context) };
  } catch (e) {
    return { ok: false, error: String(e.message ?? e) };
  }
});
process.stdout.write(JSON.stringify(results));
