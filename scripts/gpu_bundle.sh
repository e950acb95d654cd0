#!/usr/bin/env bash
# A prebuilt bundle of the CUDA build for a machine that cannot build it (docs/gpu_first_run.md).
# The GPU machines lent to this project's sessions have nvcc, CMake and PyTorch but none of our
# Debian build dependencies and no network, so scripts/gpu_check.sh cannot build there. This script,
# run where `scripts/setup.sh --test` ran, builds a Release build with the CUDA backend and writes
#   .gpu_bundle/backprop-gpu-bundle.tar.xz   (what travels: `carry: [".gpu_bundle"]`)
#   .gpu_bundle/MANIFEST.txt                 (a copy of the one inside, to read without unpacking)
# holding backprop, test_cuda, test_cuda_device and bench_cuda (bin/); every shared library they
# load (lib/), minus
#   - the glibc family (libc, libm, libdl, libpthread, librt, ld-linux): every Linux has one, and a
#     newer glibc runs programs linked against an older one (this one is Debian 12's, 2.36);
#   - libcublas and libcublasLt (54 MB and 540 MB): the GPU machine's CUDA toolkit or PyTorch's
#     nvidia-cublas wheel has them; gpu_check.sh --prebuilt finds them there.
# libcudart (0.7 MB) IS carried: the runtime the kernels were compiled against, whatever runtime the
# other machine has (cuBLAS does not link it, so the two never clash). libstdc++, libgcc_s and
# libgomp are carried too: the other machine's may be older or absent. The bundle's libraries are
# for our binaries alone: gpu_check.sh puts them on LD_LIBRARY_PATH of those commands only (python
# keeps its own libstdc++).
# Also the files the tests read from outside the repository (../shared/models/stories260K, the real
# model of test_cuda's whole-model tests; ../shared does not travel) under shared/, and MANIFEST.txt:
# git commit, CUDA version, GPU architectures, the newest glibc symbol needed, each file's size.
#
# Usage: scripts/gpu_bundle.sh [--build-dir DIR] [--out DIR] [--no-build] [--no-compress]
#                              [--only NAME,NAME] [--xz-level N]
#        scripts/gpu_bundle.sh --verify TREE [--lib-dir DIR]...
#   --build-dir  the build to take the binaries from (default build-bundle; configured here with
#                -DCMAKE_BUILD_TYPE=Release -DBACKPROP_CUDA=ON -DBACKPROP_BUILD_BENCH=ON)
#   --no-build   take the binaries as they are (fails if one is missing)
#   --no-compress  leave the unpacked tree OUT/backprop-gpu-bundle (what tests use) instead of the .tar.xz
#   --only       bundle these of backprop,test_cuda,test_cuda_device,bench_cuda only
#   --verify     checks that every library the bundle's programs and libraries need resolves inside
#                TREE/lib, or is one the bundle leaves out on purpose (glibc family, cuBLAS,
#                driver); --lib-dir adds a folder to search after TREE/lib (where cuBLAS lies).
#                Exit 1 naming each library that is missing or would come from this machine.
# Environment: BP_SHARED_DIR (default ../shared), BACKPROP_JOBS (build parallelism).
set -euo pipefail
cd "$(dirname "$0")/.."
BUNDLE_NAME=backprop-gpu-bundle
ALL_PROGRAMS=(backprop test_cuda test_cuda_device bench_cuda)
# Left to the other machine. ld-linux / linux-vdso come with the kernel and glibc.
GLIBC_FAMILY='^(libc|libm|libdl|libpthread|librt|libutil|libresolv|ld-linux-x86-64|ld-linux-aarch64|linux-vdso)\.so'
CUBLAS='^libcublas(Lt)?\.so'
DRIVER='^(libcuda|libnvidia-ml)\.so' # the driver's; never linked, loaded at run time

die() {
  echo "gpu_bundle: $*" >&2
  exit 1
}

# ---- --verify: does every needed library resolve inside the bundle (or on purpose outside)? -------
# The dynamic loader's own answer (ldd = the loader in trace mode) with the bundle's lib/ first on
# LD_LIBRARY_PATH: a library missing from lib/ resolves to this machine's copy (or to "not found"),
# and this machine's copy is exactly what the other machine will not have.
verify_tree() {
  local tree=$1
  shift
  local search="$tree/lib" dir f line name path bad=0 checked=0
  for dir in "$@"; do search="$search:$dir"; done
  [ -x "$tree/bin/backprop" ] || die "--verify: $tree/bin/backprop is missing (not a bundle tree?)"
  for f in "$tree"/bin/* "$tree"/lib/*; do
    checked=$((checked + 1))
    while IFS= read -r line; do
      name=$(awk '{print $1}' <<<"$line")
      path=$(awk '$2 == "=>" {print $3}' <<<"$line")
      [ -n "$name" ] || continue
      if [[ "$line" == *"not found"* ]]; then
        echo "gpu_bundle: $(basename "$f") needs $name: not found in the bundle or on this machine" >&2
        bad=1
      elif [[ "$name" =~ $GLIBC_FAMILY || "$name" =~ $CUBLAS || "$name" =~ $DRIVER || "$name" == /* ]]; then
        continue # left out on purpose (an absolute name is the loader itself)
      elif [ -n "$path" ] && [ "$(dirname "$(realpath "$path")")" != "$(realpath "$tree/lib")" ]; then
        echo "gpu_bundle: $(basename "$f") needs $name, which is not in the bundle (this machine has it at $path)" >&2
        bad=1
      fi
    done < <(LD_LIBRARY_PATH="$search" ldd "$f" 2>&1 | grep -v 'statically linked')
  done
  if [ "$bad" != 0 ]; then
    echo "gpu_bundle: $tree is NOT self-contained (above)" >&2
    return 1
  fi
  echo "gpu_bundle: $tree: all libraries of $checked files resolve inside the bundle or are left out on purpose (glibc, cuBLAS, driver)"
}

if [ "${1:-}" = --verify ]; then
  [ $# -ge 2 ] || die "--verify needs a bundle tree"
  tree=$2
  shift 2
  extra=()
  while [ $# -gt 0 ]; do
    case $1 in
      --lib-dir) extra+=("$2"); shift 2 ;;
      *) die "--verify: unknown argument $1" ;;
    esac
  done
  verify_tree "$tree" "${extra[@]}"
  exit $?
fi

# ---- making the bundle ----------------------------------------------------------------------------
build=build-bundle out=.gpu_bundle do_build=1 compress=1 xz_level=9 only=""
while [ $# -gt 0 ]; do
  case $1 in
    --build-dir) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-build) do_build=0; shift ;;
    --no-compress) compress=0; shift ;;
    --only) only=$2; shift 2 ;;
    --xz-level) xz_level=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) die "unknown argument $1 (--help)" ;;
  esac
done
programs=("${ALL_PROGRAMS[@]}")
[ -z "$only" ] || IFS=, read -r -a programs <<<"$only"
program_path() { # where CMake puts each program in a build folder
  case $1 in
    backprop) echo "$build/backprop" ;;
    test_cuda | test_cuda_device) echo "$build/tests/$1" ;;
    bench_cuda) echo "$build/bench/bench_cuda" ;;
    *) die "unknown program $1 (one of: ${ALL_PROGRAMS[*]})" ;;
  esac
}

if [ "$do_build" = 1 ]; then
  launcher=()
  if command -v ccache >/dev/null; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  echo "== build ($build: Release, BACKPROP_CUDA=ON, bench on) =="
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DBACKPROP_CUDA=ON -DBACKPROP_BUILD_BENCH=ON \
    "${launcher[@]}" >/dev/null
  cmake --build "$build" -j"${BACKPROP_JOBS:-$(nproc)}" --target "${programs[@]}"
fi
grep -q '^CMAKE_BUILD_TYPE:STRING=Release$' "$build/CMakeCache.txt" 2>/dev/null ||
  die "$build is not a Release build (its CMakeCache.txt says otherwise or is missing)"
grep -q 'BP_CUDA_COMPILED 1' "$build/generated/build_info.h" 2>/dev/null ||
  die "$build was built without the CUDA backend (configure it with -DBACKPROP_CUDA=ON)"
for p in "${programs[@]}"; do
  [ -x "$(program_path "$p")" ] || die "$(program_path "$p") is missing (build it, or drop --no-build)"
done
shared=${BP_SHARED_DIR:-../shared}
[ -f "$shared/models/stories260K/model.safetensors" ] ||
  die "$shared/models/stories260K is missing (test_cuda's whole-model tests read it; set BP_SHARED_DIR)"

mkdir -p "$out"
tree="$out/$BUNDLE_NAME"
rm -rf "$tree" "$out/$BUNDLE_NAME.tar.xz"
mkdir -p "$tree/bin" "$tree/lib" "$tree/shared/models"
for p in "${programs[@]}"; do cp "$(program_path "$p")" "$tree/bin/$p"; done
# The closure: ldd lists every library loaded at start, transitively; each is copied under its
# soname (what the programs ask for), following symbolic links.
for p in "${programs[@]}"; do ldd "$tree/bin/$p"; done | while IFS= read -r line; do
  name=$(awk '{print $1}' <<<"$line")
  path=$(awk '$2 == "=>" {print $3}' <<<"$line")
  [[ "$line" == *"not found"* ]] && die "$name is not found on this machine (ldd: $line)"
  [ -n "$path" ] || continue
  [[ "$name" =~ $GLIBC_FAMILY || "$name" =~ $CUBLAS ]] && continue
  [ -e "$tree/lib/$name" ] || cp -L "$path" "$tree/lib/$name"
done
cp -r "$shared/models/stories260K" "$tree/shared/models/"
chmod -R u+w "$tree/shared" # ../shared is read-only; the copy must be removable

# ---- the manifest ---------------------------------------------------------------------------------
cuda_version=$(sed -n 's/^set(CMAKE_CUDA_COMPILER_VERSION "\(.*\)")/\1/p' "$build"/CMakeFiles/*/CMakeCUDACompiler.cmake | head -1)
newest() { objdump -T "$tree"/bin/* "$tree"/lib/* 2>/dev/null | grep -o "$1_[0-9.]*" | sort -uV | tail -1; }
{
  echo "backprop GPU bundle (scripts/gpu_bundle.sh; run it with scripts/gpu_check.sh --prebuilt)"
  echo "made:         $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), $(uname -m)"
  echo "git commit:   $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "build:        $build ($(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$build/CMakeCache.txt"))"
  echo "CUDA:         nvcc $cuda_version (runtime bundled: libcudart.so.13)"
  echo "GPU code:     $(grep -o 'code=\[[^]]*\]' "$build/CMakeFiles/bp.dir/flags.make" | tr -d '[]' | sed 's/code=//' | tr '\n' ' ')"
  echo "needs:        glibc >= $(newest GLIBC | sed 's/GLIBC_//') (bundled libstdc++: $(newest GLIBCXX)), an NVIDIA driver for CUDA ${cuda_version%.*}, libcublas.so.13 + libcublasLt.so.13 on the machine"
  echo "left out:     glibc family, libcublas, libcublasLt, the driver (libcuda, libnvidia-ml)"
  echo "files (bytes):"
  (cd "$tree" && find bin lib shared -type f -printf '%s %p\n' | sort -k2)
  echo "total bytes:  $(du -sb "$tree" | cut -f1)"
} >"$tree/MANIFEST.txt"

verify_tree "$tree"

if [ "$compress" = 1 ]; then
  echo "== compressing (xz -$xz_level) =="
  tar -C "$out" -cf - "$BUNDLE_NAME" | xz -"$xz_level" -T2 >"$out/$BUNDLE_NAME.tar.xz"
  cp "$tree/MANIFEST.txt" "$out/MANIFEST.txt"
  rm -rf "$tree"
  echo "compressed:   $(stat -c %s "$out/$BUNDLE_NAME.tar.xz") bytes" >>"$out/MANIFEST.txt"
fi

# What travels to the GPU machine: the tracked tree plus the carried folder, 64 MiB at most.
bundle_bytes=$(du -sb "$out" | cut -f1)
tracked_bytes=$(git ls-files -z 2>/dev/null | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1 || echo 0)
total=$((bundle_bytes + ${tracked_bytes:-0}))
echo "gpu_bundle: $out holds $bundle_bytes bytes; with the tracked tree ($tracked_bytes bytes): $total bytes" \
  "($((total * 100 / (64 * 1024 * 1024)))% of the 64 MiB a device call carries)"
[ "$compress" = 0 ] || [ "$total" -le $((64 * 1024 * 1024)) ] || die "over the 64 MiB a device call carries"
echo "gpu_bundle: done. On the GPU machine (docs/gpu_first_run.md): bash scripts/gpu_check.sh --prebuilt $out --out \$OUT --budget 450"
