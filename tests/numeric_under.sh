#!/usr/bin/env bash
# Runs a numeric test binary under one OpenBLAS kernel set and one CPU kernel variant, so a
# tolerance tied to one machine's rounding fails here instead of on someone else's machine
# (CONVENTIONS.md; tests/CMakeLists.txt registers the runs).
#   numeric_under.sh CORETYPE VARIANT BINARY [ARGS...]
# CORETYPE: an OPENBLAS_CORETYPE (Haswell, SkylakeX, ...) that wins over the one the environment
# has (scripts/runtime_env.sh sets one), or "-" to keep the environment's. VARIANT: generic, avx2,
# avx512 (BACKPROPAGATE_RUNTIME__CPU_KERNELS, which the test binaries honour) or "-" for auto.
# Exits 77 (ctest's SKIP_RETURN_CODE) when this CPU cannot run the kernel set or the variant.
set -euo pipefail
core=$1 variant=$2
shift 2
flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
has() { for f in "$@"; do [[ $flags == *" $f "* ]] || return 1; done; }
need_avx2() { has avx2 fma f16c || { echo "SKIP: this CPU lacks AVX2/FMA/F16C ($1)"; exit 77; }; }
need_avx512() { has avx512f avx512bw avx512dq avx512vl || { echo "SKIP: this CPU lacks AVX-512 ($1)"; exit 77; }; }
case $core in
  -) ;;
  SkylakeX | Cooperlake | SapphireRapids) need_avx512 "OPENBLAS_CORETYPE=$core" ;;
  Haswell | Zen) need_avx2 "OPENBLAS_CORETYPE=$core" ;;
esac
case $variant in
  -) unset BACKPROPAGATE_RUNTIME__CPU_KERNELS ;;
  avx2) need_avx2 "kernel variant avx2" ;;
  avx512) need_avx512 "kernel variant avx512" ;;
esac
[ "$core" = - ] || export OPENBLAS_CORETYPE=$core
[ "$variant" = - ] || export BACKPROPAGATE_RUNTIME__CPU_KERNELS=$variant
exec "$@"
