# Sourced by the scripts that run backprop's code in-process (tests, benchmarks, the base-model
# recipe): the runtime environment the `backprop` binary gives itself (src/cli/main.cpp), so that
# gtest and benchmark binaries run under the same conditions. Each variable is set only when the
# user has not set it.
#   OMP_WAIT_POLICY=passive  waiting OpenMP threads sleep instead of spinning (on a shared 2-core
#                            machine spinning made 3 tiny steps take 75 s instead of 3 s).
#   OPENBLAS_CORETYPE        Debian's OpenBLAS 0.3.21 reads recent CPUs (Intel since Ice Lake, AMD
#                            Zen 4) as old ones and runs SSE3 kernels: sgemm 512x576x1536 on one
#                            core measured 19-30 GFLOP/s, with SkylakeX 150 (docs/benchmarks.md).
#                            The rule lives in one place, core/sysinfo's openblas_core_type() (from
#                            CPUID: AVX-512 -> SkylakeX, AVX2 + FMA -> Zen on AMD, Haswell
#                            elsewhere); asked from the built binary ($BUILD_DIR/backprop, default
#                            build/). Before a build exists it is left to OpenBLAS.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
if [ -z "${OPENBLAS_CORETYPE:-}" ] && [ -x "${BUILD_DIR:-build}/backprop" ]; then
  _bp_core=$("${BUILD_DIR:-build}/backprop" info --openblas-coretype 2>/dev/null || true)
  [ -n "$_bp_core" ] && export OPENBLAS_CORETYPE=$_bp_core
  unset _bp_core
fi
