#!/usr/bin/env bash
# The Debian package (cmake/packaging.cmake) installs a backprop that works from any folder.
# Registered by cmake/packaging.cmake: package_test.sh BUILD_DIR (backprop built there).
#   1. cpack makes the .deb from BUILD_DIR (what `cmake --build build --target deb` runs; the
#      package lands in a scratch folder, BUILD_DIR is left alone);
#   2. its Depends name the Debian package of every library backprop links (objdump's NEEDED, found
#      where the loader finds it, ldd), or a name that package provides; a library no package owns,
#      like the CUDA toolkit's in /usr/local, is named and left out;
#   3. dpkg -x unpacks it into a scratch root (no root needed), which must hold the program, the demo
#      model, the quick start's data and the docs;
#   4. from a scratch working folder outside the repository: `backprop info`, and the quick start
#      (`backprop train` with no model or data, 3 steps), which must take the model and data from
#      the package's share/backpropagate and write its adapter and GGUF file under ./runs;
#   5. where BUILD_DIR built the Python package: it is in the package, and Debian's python3 imports
#      it from the scratch root's dist-packages and trains the packaged model 2 steps with it.
# About 30 s of CPU (105 s of wall time on a busy 2-core machine, 2026-11-29).
set -euo pipefail
build=$(cd "$1" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

SECONDS=0
echo "== 1. cpack -G DEB"
cpack -G DEB --config "$build/CPackConfig.cmake" -B "$tmp/out" > "$tmp/cpack.log" 2>&1 ||
  { cat "$tmp/cpack.log"; fail "cpack failed"; }
debs=("$tmp"/out/backpropagate_*.deb)
[ -f "${debs[0]}" ] || { cat "$tmp/cpack.log"; fail "no backpropagate_*.deb in $tmp/out"; }
deb=${debs[0]}
echo "$(basename "$deb"): $(du -h "$deb" | cut -f1)"
dpkg-deb -f "$deb" Package Version Architecture Depends
# One package name a line: "a (>= 1), b | c" -> a, b, c.
depends=$(dpkg-deb -f "$deb" Depends | tr ',|' '\n\n' | sed -E 's/\(.*//; s/ //g')

echo "== 3. dpkg -x ($SECONDS s so far)"
root=$tmp/root
dpkg -x "$deb" "$root"
share=$root/usr/share/backpropagate
for f in usr/bin/backprop usr/share/backpropagate/models/tiny-chat/config.json \
  usr/share/backpropagate/models/tiny-chat/model.safetensors usr/share/backpropagate/models/tiny-chat/tokenizer.json \
  usr/share/backpropagate/examples/quickstart_sharegpt.jsonl \
  usr/share/backpropagate/examples/quickstart_sharegpt_holdout.jsonl \
  usr/share/doc/backpropagate/README.md usr/share/doc/backpropagate/docs/settings.md; do
  [ -f "$root/$f" ] || fail "the package lacks /$f"
done

echo "== 2. Depends against the libraries backprop loads ($SECONDS s so far)"
ldd "$root/usr/bin/backprop" > "$tmp/ldd.txt"
! grep -q "not found" "$tmp/ldd.txt" || { cat "$tmp/ldd.txt"; fail "backprop misses a library here"; }
while read -r path; do
  owner=""
  # usrmerge: a library may be registered under /lib or /usr/lib and loaded through the other.
  for p in "$path" "$(readlink -f "$path")" "${path#/usr}" "/usr$path"; do
    owner=$(dpkg -S "$p" 2>/dev/null | head -1 | cut -d: -f1) && [ -n "$owner" ] && break
  done
  if [ -z "$owner" ]; then
    echo "  $path: no Debian package owns it (left out of Depends)"
    continue
  fi
  # The package, or a name it provides (libspdlog1.10 provides the libspdlog1.10-fmt9 its shlibs file names).
  names=$owner$(dpkg-query -W -f=',${Provides}' "$owner" | sed -E 's/ \([^)]*\)//g; s/ //g')
  found=""
  for n in ${names//,/ }; do
    grep -qxF "$n" <<<"$depends" && found=$n && break
  done
  [ -n "$found" ] || fail "Depends lacks $owner (for $path): $(dpkg-deb -f "$deb" Depends)"
  echo "  $path: $owner${found:+ (as $found)}"
done < <(objdump -p "$root/usr/bin/backprop" | awk '$1 == "NEEDED" {print $2}' |
  while read -r soname; do awk -v n="$soname" '$1 == n && $2 == "=>" {print $3}' "$tmp/ldd.txt"; done)

echo "== 4. backprop info and the quick start from $tmp/work ($SECONDS s so far)"
mkdir "$tmp/work"
cd "$tmp/work"
"$root/usr/bin/backprop" info > info.txt 2>&1 || { cat info.txt; fail "backprop info exited $?"; }
head -3 info.txt
"$root/usr/bin/backprop" train --device cpu --steps 3 --warmup-steps 1 > train.txt 2>&1 ||
  { cat train.txt; fail "the quick start exited $?"; }
tail -20 train.txt
grep -qF "Quick start: LoRA fine-tuning of $share/models/tiny-chat on $share/examples/quickstart_sharegpt.jsonl" train.txt ||
  fail "the quick start did not take the packaged model and data"
runs=(runs/*/)
[ -d "${runs[0]}" ] || fail "no run folder under $tmp/work/runs"
run=${runs[0]%/}
for f in adapter/adapter_model.safetensors adapter/adapter_config.json summary.json export/tiny-chat-q8_0.gguf; do
  [ -s "$run/$f" ] || fail "the quick start did not write $run/$f"
done
grep -q '"steps": 3' "$run/summary.json" || fail "summary.json does not say 3 steps: $(cat "$run/summary.json")"

if [ -f "$build/python/backpropagate/__init__.py" ]; then
  echo "== 5. import backpropagate from the package ($SECONDS s so far)"
  site=$root/usr/lib/python3/dist-packages
  [ -f "$site/backpropagate/__init__.py" ] && ls "$site"/backpropagate/_core*.so >/dev/null 2>&1 ||
    fail "the package lacks the Python package under /usr/lib/python3/dist-packages"
  grep -qw python3 <<<"$depends" || fail "Depends lacks python3: $(dpkg-deb -f "$deb" Depends)"
  PYTHONPATH=$site BP_SHARE=$share /usr/bin/python3 - > python.txt 2>&1 <<'PY' || { cat python.txt; fail "the packaged Python package failed"; }
import os
import backpropagate as bp
assert bp.__file__.startswith(os.environ["PYTHONPATH"]), bp.__file__
share = os.environ["BP_SHARE"]
r = bp.Trainer(share + "/models/tiny-chat", steps=2, batch_size=2, max_seq_length=64, lora_r=4,
               device="cpu").train(share + "/examples/quickstart_sharegpt.jsonl")
assert os.path.isfile(os.path.join(r.adapter_path, "adapter_model.safetensors")), r.adapter_path
print("python run", r.run_id, r.final_loss)
PY
  tail -1 python.txt
fi
echo "OK ($SECONDS s)"
