#!/usr/bin/env bash
# The GPU bundle (scripts/gpu_bundle.sh) is self-contained, and the check that says so can fail.
# Registered in tests/CMakeLists.txt (CUDA builds): gpu_bundle_test.sh BUILD_DIR. About 10 s.
#   1. bundles BUILD_DIR's backprop, test_cuda, test_cuda_device (and bench_cuda if built), unpacked;
#      gpu_bundle.sh checks it (--verify: every library resolves inside the bundle or is one left out
#      on purpose);
#   2. runs the bundle where nothing of this machine is: a chroot holding only the glibc family, the
#      bundle, stub libcublas/libcublasLt (the real ones are 600 MB; these define the symbols the
#      programs import, under cuBLAS's version names, and are never called here) and models/tiny-chat
#      as the repository: `backprop info`, and test_cuda's kernel tests plus the whole-model steps of
#      stories260K (read from the bundle's shared/, BP_SHARED_DIR) and tiny-chat (BP_SOURCE_DIR).
#      Needs root (or an unprivileged user namespace): without either this part says so and is left out;
#   3. deletes one library (libfmt) from the bundle: --verify must fail naming it, and so must
#      `backprop info` in the chroot;
#   4. scripts/gpu_check.sh --prebuilt on a compressed bundle (xz -0: fast) unpacks and verifies it,
#      then, on a machine without a GPU, exits 2 with its "no NVIDIA GPU" message;
#   5. gpu_check.sh's budget (--budget: a device call must end in time and leave a rerun), with a fake
#      nvidia-smi that lists a GPU, so that every stage runs here and fails for want of a device, except
#      the simulated kernel tests, which take minutes on 2 cores: the script must stop them at the budget
#      and report them STOPPED, leave the stage after them out for the budget (skipped), give each
#      benchmark model its own summary row and bring back no more files than a device call fetches;
#      and with the budget spent before the first stage, skip everything and exit 3, not 0.
set -euo pipefail
build=$(cd "$1" && pwd)
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

programs=backprop,test_cuda,test_cuda_device
[ -x "$build/bench/bench_cuda" ] && programs=$programs,bench_cuda
echo "== 1. bundle ($programs) and --verify"
bash scripts/gpu_bundle.sh --no-build --build-dir "$build" --no-compress --only "$programs" --out "$tmp/out"
tree=$tmp/out/backprop-gpu-bundle
bash scripts/gpu_bundle.sh --verify "$tree" || fail "--verify rejects a complete bundle"
# The same question with this test's own list of what may come from outside (--verify shares its
# list with the bundler, so a library both leave out by mistake would pass it): the loader's
# answer for every file, bundle first on the path.
for f in "$tree"/bin/* "$tree"/lib/*; do
  LD_LIBRARY_PATH=$tree/lib ldd "$f" | awk -v lib="$tree/lib/" -v f="$f" '
    $1 ~ /^(libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|libcublas\.so\.13|libcublasLt\.so\.13|linux-vdso\.so\.1)$/ {next}
    $1 ~ /^\/.*ld-linux/ || /statically linked/ {next}
    $2 == "=>" && index($3, lib) == 1 {next}
    {print f ": " $0; bad = 1} END {exit bad}' || fail "a library the bundle lacks (above)"
done

echo "== 2. the bundle in a chroot with nothing but glibc"
root=$tmp/root
mkdir -p "$root/tmp" "$root/cuda" "$root/repo/models"
mv "$tree" "$root/bundle"
tree=$root/bundle
ldd "$tree/bin/backprop" | grep -oE '/[^ ]*/(libc|libm|libdl|libpthread|librt)\.so[.0-9]*|/[^ ]*ld-linux[^ ]*' |
  sort -u | while read -r lib; do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
# Stub cuBLAS: each imported symbol (objdump -T: "*UND* ... (libcublasLt.so.13) name") defined
# under its version name.
objdump -T "$tree"/bin/* | awk '/\*UND\*/ && /\(libcublas(Lt)?\.so\.13\)/ {v = $(NF-1); gsub(/[()]/, "", v); print v, $NF}' |
  sort -u >"$tmp/cublas_symbols"
for lib in libcublas.so.13 libcublasLt.so.13; do
  awk -v l="$lib" '$1 == l {print "int " $2 "(void) { return 14; }"}' "$tmp/cublas_symbols" >"$tmp/$lib.c"
  awk -v l="$lib" 'BEGIN {print l " {\n global:"} $1 == l {print "  " $2 ";"} END {print " local: *;\n};"}' \
    "$tmp/cublas_symbols" >"$tmp/$lib.map"
  "${CC:-cc}" -shared -fPIC -o "$root/cuda/$lib" "-Wl,-soname,$lib" "-Wl,--version-script=$tmp/$lib.map" "$tmp/$lib.c"
done
cp -r models/tiny-chat "$root/repo/models/"
in_root() { # in_root COMMAND...: runs it inside the chroot (as root, or root of a user namespace)
  local -a chroot_cmd=("$(command -v chroot)" "$root")
  [ "$(id -u)" = 0 ] || chroot_cmd=("$(command -v unshare)" --map-root-user "${chroot_cmd[@]}")
  env -i LD_LIBRARY_PATH=/bundle/lib:/cuda BP_SHARED_DIR=/bundle/shared BP_SOURCE_DIR=/repo TMPDIR=/tmp \
    "${chroot_cmd[@]}" "$@"
}
# Whether chroot works here at all, asked of the loader alone (it needs nothing else), so that a
# broken bundle can never pass for "no chroot".
chroot_ok=1
loader=$(cd "$root" && find lib64 lib -name 'ld-linux*' 2>/dev/null | head -1)
if ! in_root "/$loader" --version >"$tmp/probe" 2>&1; then
  chroot_ok=0
  echo "NOTE: no chroot here (not root, no user namespaces): part 2 left out: $(head -1 "$tmp/probe")"
fi
if [ "$chroot_ok" = 1 ]; then
  in_root /bundle/bin/backprop info >"$tmp/info" 2>&1 || { cat "$tmp/info"; fail "backprop info in the chroot"; }
  grep -q 'cuda_backend *yes' "$tmp/info" || { cat "$tmp/info"; fail "backprop info in the chroot: no CUDA backend"; }
  in_root /bundle/bin/test_cuda --gtest_brief=1 \
    '--gtest_filter=CudaRmsNorm.*:GemmDesc.*:CudaModel.Stories260KLoraStepMatchesCpu:CudaModel.TinyChatLoraStepWithoutCheckpointingMatchesCpu' \
    >"$tmp/tests" 2>&1 || { cat "$tmp/tests"; fail "test_cuda in the chroot"; }
  grep -q '\[  PASSED  \] [1-9]' "$tmp/tests" || { cat "$tmp/tests"; fail "test_cuda ran nothing"; }
  tail -2 "$tmp/tests"
fi

echo "== 3. one library less: both checks must fail"
mv "$tree/lib/libfmt.so.9" "$tmp/"
if bash scripts/gpu_bundle.sh --verify "$tree" >"$tmp/verify" 2>&1; then
  fail "--verify passed a bundle without libfmt.so.9"
fi
grep -q 'needs libfmt.so.9, which is not in the bundle' "$tmp/verify" || { cat "$tmp/verify"; fail "--verify did not name libfmt"; }
if [ "$chroot_ok" = 1 ]; then
  if in_root /bundle/bin/backprop info >"$tmp/info" 2>&1; then fail "backprop ran in the chroot without libfmt.so.9"; fi
  grep -q 'libfmt.so.9' "$tmp/info" || { cat "$tmp/info"; fail "the chroot run failed, but not for libfmt"; }
fi
mv "$tmp/libfmt.so.9" "$tree/lib/"
echo "ok: without libfmt.so.9 --verify fails$([ "$chroot_ok" = 1 ] && echo " and backprop does not start in the chroot")"

echo "== 4. gpu_check.sh --prebuilt on a compressed bundle"
bash scripts/gpu_bundle.sh --no-build --build-dir "$build" --only backprop --xz-level 0 --out "$tmp/packed" >/dev/null
[ -f "$tmp/packed/backprop-gpu-bundle.tar.xz" ] && [ -f "$tmp/packed/MANIFEST.txt" ] || fail "no .tar.xz + MANIFEST.txt"
grep -q '^git commit: *[0-9a-f]\{40\}' "$tmp/packed/MANIFEST.txt" || fail "the manifest names no commit"
status=0
bash scripts/gpu_check.sh --prebuilt "$tmp/packed" >"$tmp/check" 2>&1 || status=$?
cat "$tmp/check"
grep -q 'all libraries of .* resolve inside the bundle' "$tmp/check" || fail "gpu_check did not verify the unpacked bundle"
if nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "NOTE: this machine has a GPU: the exit-2 check is left out"
else
  [ "$status" = 2 ] || fail "gpu_check --prebuilt without a GPU exited $status, not 2"
  grep -q 'no NVIDIA GPU is visible' "$tmp/check" || fail "no 'no NVIDIA GPU' message"
fi

echo "== 5. gpu_check.sh --budget: every program stopped in time, what is left out said"
mkdir -p "$tmp/fake-gpu"
cat >"$tmp/fake-gpu/nvidia-smi" <<'SH'
#!/bin/sh
# A GPU that is listed but has no driver behind it: gpu_check.sh's stages run and find no device.
case "$1" in
  -L) echo "GPU 0: Fake H200 of gpu_bundle_test.sh (UUID: GPU-00000000-0000-0000-0000-000000000000)" ;;
  *) printf 'name, compute_cap, driver_version, memory.total [MiB]\nFake H200, 9.0, 580.0, 143771 MiB\n' ;;
esac
SH
chmod +x "$tmp/fake-gpu/nvidia-smi"
# CUDA_VISIBLE_DEVICES empty: the programs see no device on a machine with a real GPU either.
export CUDA_VISIBLE_DEVICES=
budget=40
t0=$SECONDS status=0
PATH=$tmp/fake-gpu:$PATH BP_STAGE_MIN_S=5 BP_TEST_SHARDS=2 BP_BENCH_SHAPES=qwen2.5-0.5b,qwen2.5-1.5b \
  bash scripts/gpu_check.sh --prebuilt "$tree" --out "$tmp/gpu-out" --budget "$budget" \
  --stage device-tests,bench,sim-tests,end-to-end >"$tmp/budget" 2>&1 || status=$?
took=$((SECONDS - t0))
cat "$tmp/budget"
[ "$took" -le "$budget" ] || fail "gpu_check --budget $budget took $took s"
[ "$status" = 1 ] || fail "gpu_check exited $status with failed stages, not 1"
row() { grep -qE "^$1 +$2 " "$tmp/gpu-out/summary.txt" || fail "summary.txt has no '$1 $2' row"; }
row device-tests FAILED
row bench:qwen2.5-0.5b FAILED
row bench:qwen2.5-1.5b FAILED
row sim-tests STOPPED
row end-to-end skipped
grep -q "stage 'sim-tests' STOPPED: the budget of $budget s ran out" "$tmp/budget" || fail "no STOPPED message"
grep -q "stage 'end-to-end' skipped" "$tmp/gpu-out/end-to-end.log" || fail "the skipped stage's log does not say so"
grep -q "left out for the budget: end-to-end" "$tmp/budget" || fail "the last line does not name what was left out"
files=$(find "$tmp/gpu-out" -type f | wc -l)
[ "$files" -le 8 ] || fail "$files files in --out, more than the 8 a device call brings back"
echo "ok: budget $budget s, ended after $took s; sim-tests stopped, end-to-end left out; $files files"
# A budget spent before the first stage: nothing starts, nothing fails, exit 3 (not 0: not checked).
status=0
PATH=$tmp/fake-gpu:$PATH BP_BUDGET_S=11 bash scripts/gpu_check.sh --prebuilt "$tree" --out "$tmp/gpu-out2" \
  --stage device-tests >"$tmp/budget2" 2>&1 || status=$?
cat "$tmp/budget2"
[ "$status" = 3 ] || fail "gpu_check with every stage left out for the budget exited $status, not 3"
grep -qE "^device-tests +skipped " "$tmp/gpu-out2/summary.txt" || fail "device-tests not reported skipped"
echo "PASS"
