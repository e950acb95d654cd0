// Choosing the CPU kernel variant (kernel_variants.h): from CPUID at the first use, or forced by
// the runtime.cpu_kernels setting through select_cpu_kernels().
#include "backend/cpu/kernel_variants.h"

#include <fmt/format.h>

#include <atomic>
#include <mutex>

#include "core/error.h"
#include "core/sysinfo.h"

namespace bp::cpu {

namespace generic {
const KernelTable& table();
}
#if defined(__x86_64__)
namespace avx2 {
const KernelTable& table();
}
namespace avx512 {
const KernelTable& table();
}
#endif

namespace {

struct Active {
  std::mutex mutex;
  std::atomic<const KernelTable*> table{nullptr};
  KernelChoice choice;
};

Active& active() {
  static Active a;
  return a;
}

bool supported(KernelVariant v, const CpuIsa& isa) {
  switch (v) {
    case KernelVariant::Generic: return true;
#if defined(__x86_64__)
    case KernelVariant::Avx2: return isa.avx2_fma;
    case KernelVariant::Avx512: return isa.avx512;
#else
    default: return false;
#endif
  }
  return false;
}

const KernelTable& table_of(KernelVariant v) {
#if defined(__x86_64__)
  if (v == KernelVariant::Avx512) return avx512::table();
  if (v == KernelVariant::Avx2) return avx2::table();
#endif
  return generic::table();
}

KernelVariant best(const CpuIsa& isa) {
  return supported(KernelVariant::Avx512, isa) ? KernelVariant::Avx512
         : supported(KernelVariant::Avx2, isa) ? KernelVariant::Avx2
                                               : KernelVariant::Generic;
}

std::string detected_reason(const CpuIsa& isa) {
  if (isa.avx512) return "detected: the CPU has AVX-512 (F, BW, DQ, VL)";
  if (isa.avx2_fma) return "detected: the CPU has AVX2 + FMA + F16C, no AVX-512";
#if defined(__x86_64__)
  return "detected: the CPU has neither AVX2 + FMA nor AVX-512";
#else
  return "detected: not an x86-64 CPU (no x86 variants in this build)";
#endif
}

void set_active(KernelVariant v, std::string reason) {
  auto& a = active();
  a.choice = {v, std::move(reason)};
  a.table.store(&table_of(v), std::memory_order_release);
}

}  // namespace

const char* kernel_variant_name(KernelVariant v) {
  switch (v) {
    case KernelVariant::Generic: return "generic";
    case KernelVariant::Avx2: return "avx2";
    case KernelVariant::Avx512: return "avx512";
  }
  return "generic";
}

std::vector<KernelVariant> supported_kernel_variants() {
  const CpuIsa isa = cpu_isa();
  std::vector<KernelVariant> out;
  for (KernelVariant v : {KernelVariant::Generic, KernelVariant::Avx2, KernelVariant::Avx512})
    if (supported(v, isa)) out.push_back(v);
  return out;
}

const KernelTable& kernel_table(KernelVariant v) {
  if (!supported(v, cpu_isa()))
    throw Error(ErrorCode::RUNTIME_INTERNAL,
                fmt::format("[cpu kernels] variant {} is not supported on this CPU", kernel_variant_name(v)));
  return table_of(v);
}

const KernelTable& cpu_kernels() {
  auto& a = active();
  if (const KernelTable* t = a.table.load(std::memory_order_acquire)) return *t;
  std::lock_guard<std::mutex> lock(a.mutex);
  if (const KernelTable* t = a.table.load(std::memory_order_acquire)) return *t;
  const CpuIsa isa = cpu_isa();
  set_active(best(isa), detected_reason(isa));
  return *a.table.load(std::memory_order_acquire);
}

KernelChoice cpu_kernel_choice() {
  cpu_kernels();
  auto& a = active();
  std::lock_guard<std::mutex> lock(a.mutex);
  return a.choice;
}

void select_cpu_kernels(std::string_view name) {
  select_cpu_kernels(name, cpu_isa());
}

void select_cpu_kernels(std::string_view name, const CpuIsa& isa) {
  auto& a = active();
  std::lock_guard<std::mutex> lock(a.mutex);
  if (name == "auto") {
    set_active(best(isa), detected_reason(isa));
    return;
  }
  for (KernelVariant v : {KernelVariant::Generic, KernelVariant::Avx2, KernelVariant::Avx512}) {
    if (name != kernel_variant_name(v)) continue;
    if (!supported(v, isa)) {
      std::string runs;
      for (KernelVariant w : {KernelVariant::Generic, KernelVariant::Avx2, KernelVariant::Avx512})
        if (supported(w, isa)) runs += (runs.empty() ? "" : ", ") + std::string(kernel_variant_name(w));
      throw Error(ErrorCode::DEP_CPU_KERNELS_UNSUPPORTED,
                  fmt::format("[cpu kernels] runtime.cpu_kernels = {} but this CPU ({}) cannot run it: it needs {}; "
                              "this CPU runs: {}",
                              name, isa.vendor.empty() ? "not x86-64" : isa.vendor,
                              v == KernelVariant::Avx2 ? "AVX2, FMA and F16C" : "AVX-512 F, BW, DQ and VL", runs));
    }
    set_active(v, "forced by runtime.cpu_kernels");
    return;
  }
  throw Error(ErrorCode::CONFIG_INVALID_SETTING,
              fmt::format("[cpu kernels] runtime.cpu_kernels = '{}' is not one of auto, generic, avx2, avx512", name));
}

}  // namespace bp::cpu
