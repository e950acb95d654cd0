#!/usr/bin/env bash
# What ptxas gives each CUDA kernel of src/backend/cuda on one architecture: registers per thread,
# stack frame, spill stores/loads (bytes of local memory traffic per thread), static shared memory.
# Needs no GPU: it recompiles each .cu with the flags of an existing CUDA build (its
# compile_commands.json) for the one arch asked, with -Xptxas -v. A spill or a stack frame in a hot
# kernel is a lead for a profiling session; nothing here is a timing (docs/benchmarks.md records it).
#   bash scripts/kernel_resources.sh [BUILD_DIR (build)] [SM (90)] [FILE_FILTER (regex over .cu names)]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
sm=${2:-90}
filter=${3:-.}
db="$build/compile_commands.json"
if [ ! -f "$db" ]; then
  echo "kernel_resources: $db not found: configure a CUDA build first (cmake -S . -B $build -DBACKPROP_CUDA=ON)" >&2
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf '%-5s %-4s %-6s %-7s %-7s %-7s %s\n' file regs stack spillst spillld smem kernel
for cu in src/backend/cuda/*.cu; do
  name=$(basename "$cu" .cu)
  [[ $name =~ $filter ]] || continue
  # The build's own command for this file, its arch list replaced by the one asked and its output
  # moved to the scratch folder.
  cmd=$(sed -n "s|.*\"command\": \"\(.*-c $PWD/$cu -o [^\"]*\)\".*|\1|p" "$db" | head -1)
  if [ -z "$cmd" ]; then
    echo "kernel_resources: no compile command for $cu in $db (a CUDA build?)" >&2
    exit 1
  fi
  cmd=$(sed -e 's/--generate-code=[^ ]*//g' -e "s| -o [^ ]*$| -o $work/$name.o|" <<<"$cmd")
  (cd "$build" && eval "$cmd --generate-code=arch=compute_$sm,code=sm_$sm -Xptxas -v") >"$work/$name.log" 2>&1 || {
    cat "$work/$name.log" >&2
    exit 1
  }
  awk -v file="$name" '
    /Compiling entry function/ { fn = $0; sub(/.*function .\047?/, "", fn); sub(/\047 for.*/, "", fn); stack = spst = spld = "?" }
    /bytes stack frame/ { stack = $1; spst = $5; spld = $9 }
    /Used [0-9]+ registers/ {
      regs = $0; sub(/.*Used /, "", regs); sub(/ registers.*/, "", regs)
      smem = 0; if ($0 ~ /bytes smem/) { smem = $0; sub(/.*registers, /, "", smem); sub(/ bytes smem.*/, "", smem); sub(/.* /, "", smem) }
      print file, regs, stack, spst, spld, smem, fn
    }' "$work/$name.log" | while read -r f r st ss sl sm_ fn; do
    printf '%-5s %-4s %-6s %-7s %-7s %-7s %s\n' "${f:0:5}" "$r" "$st" "$ss" "$sl" "$sm_" "$(c++filt "$fn" | sed -e "s/(.*//" -e "s/^void //")"
  done
done
