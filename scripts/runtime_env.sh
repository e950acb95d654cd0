# Sourced by the scripts that run backprop's code in-process (tests, benchmarks, the base-model
# recipe): the runtime environment the `backprop` binary gives itself (src/cli/main.cpp), so that
# gtest and benchmark binaries run under the same conditions. Each variable is set only when the
# user has not set it.
#   OMP_WAIT_POLICY=passive  waiting OpenMP threads sleep instead of spinning (on a shared 2-core
#                            machine spinning made 3 tiny steps take 75 s instead of 3 s).
#   OPENBLAS_CORETYPE        Debian's OpenBLAS 0.3.21 reads recent Intel CPUs as "Prescott" and
#                            runs SSE3 kernels: sgemm 512x576x1536 on one core measured 19-30
#                            GFLOP/s, with SkylakeX 150 (docs/benchmarks.md). Named from the CPU
#                            flags the OS reports: AVX-512 (F, BW, VL) -> SkylakeX, AVX2 + FMA ->
#                            Haswell; otherwise left to OpenBLAS.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  _bp_flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | tr ' ' '\n')
  _bp_has() { printf '%s\n' "$_bp_flags" | grep -qx "$1"; }
  if _bp_has avx512f && _bp_has avx512bw && _bp_has avx512vl; then
    export OPENBLAS_CORETYPE=SkylakeX
  elif _bp_has avx2 && _bp_has fma; then
    export OPENBLAS_CORETYPE=Haswell
  fi
  unset -f _bp_has
  unset _bp_flags
fi
