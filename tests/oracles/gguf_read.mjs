// Oracle: parses a GGUF file with @huggingface/gguf (an independent implementation) and prints its
// header, metadata (with GGUF value types) and tensor table as JSON on stdout.
// Usage: node tests/oracles/gguf_read.mjs FILE.gguf
import { gguf } from "@huggingface/gguf";
import path from "node:path";

const file = process.argv[2];
if (!file) {
  console.error("usage: node gguf_read.mjs FILE.gguf");
  process.exit(2);
}
const { metadata, typedMetadata, tensorInfos, tensorDataOffset } = await gguf(path.resolve(file), {
  allowLocalFile: true,
  typedMetadata: true,
});
// BigInt -> Number when exact, else a decimal string.
const plain = (v) => {
  if (typeof v === "bigint") return v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v.toString();
  if (Array.isArray(v)) return v.map(plain);
  return v;
};
const out = {
  version: plain(metadata.version),
  tensor_count: plain(metadata.tensor_count),
  kv_count: plain(metadata.kv_count),
  tensor_data_offset: plain(tensorDataOffset),
  metadata: {},
  tensors: tensorInfos.map((t) => ({ name: t.name, shape: t.shape.map(plain), dtype: t.dtype, offset: plain(t.offset) })),
};
for (const [key, tv] of Object.entries(typedMetadata)) {
  if (key === "version" || key === "tensor_count" || key === "kv_count") continue;
  const e = { type: tv.type, value: plain(tv.value) };
  if (tv.subType !== undefined) e.sub_type = tv.subType;
  out.metadata[key] = e;
}
process.stdout.write(JSON.stringify(out));
