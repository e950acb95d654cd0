// The CPU GEMM engine choice and oneDNN's bf16 matmul (see gemm_engine.h).
#include "backend/cpu/gemm_engine.h"

#include <fmt/format.h>

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/sysinfo.h"

#ifdef BP_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace bp::cpu {

const char* held_bf16_path_name(HeldBf16Path p) {
  switch (p) {
    case HeldBf16Path::F32: return "f32-openblas";
    case HeldBf16Path::Bf16Sgemm: return "bf16-openblas";
    case HeldBf16Path::OneDnn: return "bf16-onednn";
  }
  return "?";
}

bool onednn_built() {
#ifdef BP_HAVE_ONEDNN
  return true;
#else
  return false;
#endif
}

std::string onednn_version() {
#ifdef BP_HAVE_ONEDNN
  const dnnl_version_t* v = dnnl_version();
  return fmt::format("{}.{}.{}", v->major, v->minor, v->patch);
#else
  return "";
#endif
}

bool cpu_has_bf16_dot(const CpuIsa& isa) {
  return isa.avx512_bf16 || isa.amx_bf16;
}

namespace {

struct ActiveChoice {
  std::mutex mutex;
  bool decided = false;
  GemmEngineChoice choice;
};

ActiveChoice& active() {
  static ActiveChoice a;
  return a;
}

std::string bf16_features(const CpuIsa& isa) {
  if (isa.amx_bf16 && isa.avx512_bf16) return "AMX-BF16 and AVX512_BF16";
  if (isa.amx_bf16) return "AMX-BF16";
  return "AVX512_BF16";
}

GemmEngineChoice decide(std::string_view name, const CpuIsa& isa, bool have_onednn);

#ifdef BP_HAVE_ONEDNN

using dt = dnnl::memory::data_type;

// One cached matmul: the primitive, its memory descriptors and the scratchpad it needs (user
// scratchpad mode: each call brings its own, so one primitive runs on several threads at once).
struct Matmul {
  dnnl::matmul prim;
  dnnl::memory::desc src, wei, dst, scratch;
  size_t scratch_bytes = 0;
};

using Key = std::tuple<int, int64_t, int64_t, int64_t, float>;

struct Cache {
  std::mutex mutex;
  // (kind: 0 = x·Wᵀ, 1 = x·W; M, N, K; beta) -> primitive, and the keys in the order they were made:
  // packed micro-batches give a new M (tokens) at almost every step, so the oldest primitive goes
  // once kOnednnCachedPrimitives are held (a caller still running it keeps its shared_ptr).
  std::map<Key, std::shared_ptr<const Matmul>> prims;
  std::deque<Key> order;
  std::atomic<int64_t> made{0};
  std::string last_impl;
};

Cache& cache() {
  static Cache c;
  return c;
}

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// The matmul of `kind` for these shapes: src [M, Kd] bf16, weights [Kd, Nd] bf16, dst [M, Nd] f32.
// x·Wᵀ (kind 0): Kd = K, Nd = N, the weights W [N, K] read transposed (strides {1, K});
// x·W (kind 1): Kd = N, Nd = K, W [N, K] read as stored.
std::shared_ptr<const Matmul> matmul_for(int kind, int64_t M, int64_t N, int64_t K, float beta) {
  Cache& c = cache();
  const auto key = std::make_tuple(kind, M, N, K, beta);
  std::lock_guard<std::mutex> lock(c.mutex);
  if (auto it = c.prims.find(key); it != c.prims.end()) return it->second;
  const int64_t Kd = kind == 0 ? K : N, Nd = kind == 0 ? N : K;
  auto m = std::make_shared<Matmul>();
  m->src = dnnl::memory::desc({M, Kd}, dt::bf16, dnnl::memory::dims{Kd, 1});
  m->wei = kind == 0 ? dnnl::memory::desc({Kd, Nd}, dt::bf16, dnnl::memory::dims{1, Kd})
                     : dnnl::memory::desc({Kd, Nd}, dt::bf16, dnnl::memory::dims{Nd, 1});
  m->dst = dnnl::memory::desc({M, Nd}, dt::f32, dnnl::memory::dims{Nd, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(beta);
    attr.set_post_ops(po);
  }
  try {
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(m->src, m->wei, m->dst), attr, engine());
    m->prim = dnnl::matmul(pd);
    m->scratch = pd.scratchpad_desc();
    m->scratch_bytes = m->scratch.get_size();
    c.last_impl = pd.impl_info_str();
  } catch (const dnnl::error& e) {
    throw Error(ErrorCode::DEP_CPU_GEMM_UNAVAILABLE,
                fmt::format("[cpu gemm] oneDNN {} cannot make a bf16 matmul [{}x{}]·[{}x{}] on this CPU ({}): it "
                            "needs AVX-512 at least; use --cpu-gemm auto or openblas",
                            onednn_version(), M, Kd, Kd, Nd, e.what()));
  }
  c.made.fetch_add(1, std::memory_order_relaxed);
  c.prims.emplace(key, m);
  c.order.push_back(key);
  while (static_cast<int64_t>(c.order.size()) > kOnednnCachedPrimitives) {
    c.prims.erase(c.order.front());
    c.order.pop_front();
  }
  return m;
}

void run_matmul(const Matmul& m, const uint16_t* src, const uint16_t* wei, float* dst) {
  thread_local std::vector<uint8_t> scratch;
  if (scratch.size() < m.scratch_bytes) scratch.resize(m.scratch_bytes);
  dnnl::engine& e = engine();
  dnnl::stream s(e);
  dnnl::memory src_m(m.src, e, const_cast<uint16_t*>(src));
  dnnl::memory wei_m(m.wei, e, const_cast<uint16_t*>(wei));
  dnnl::memory dst_m(m.dst, e, dst);
  dnnl::memory scr_m(m.scratch, e, scratch.data());
  try {
    m.prim.execute(
        s, {{DNNL_ARG_SRC, src_m}, {DNNL_ARG_WEIGHTS, wei_m}, {DNNL_ARG_DST, dst_m}, {DNNL_ARG_SCRATCHPAD, scr_m}});
    s.wait();
  } catch (const dnnl::error& e) {
    throw Error(ErrorCode::RUNTIME_INTERNAL, fmt::format("[cpu gemm] oneDNN's bf16 matmul failed: {}", e.what()));
  }
}

#endif  // BP_HAVE_ONEDNN

[[noreturn]] void no_onednn() {
  throw Error(ErrorCode::DEP_CPU_GEMM_UNAVAILABLE,
              "[cpu gemm] runtime.cpu_gemm = onednn but this build of backprop has no oneDNN linked in (built "
              "without libdnnl-dev, or with -DBACKPROP_ONEDNN=OFF); use --cpu-gemm auto or openblas");
}

GemmEngineChoice decide(std::string_view name, const CpuIsa& isa, bool have_onednn) {
  GemmEngineChoice c;
  c.setting = std::string(name);
  if (name == "openblas") {
    c.held_bf16 = HeldBf16Path::F32;
    c.reason = "forced by runtime.cpu_gemm = openblas: activations stay f32";
  } else if (name == "onednn") {
    if (!have_onednn) no_onednn();
    c.held_bf16 = HeldBf16Path::OneDnn;
    c.reason = "forced by runtime.cpu_gemm = onednn";
  } else if (name == "auto") {
    if (have_onednn && cpu_has_bf16_dot(isa)) {
      c.held_bf16 = HeldBf16Path::OneDnn;
      c.reason = fmt::format("auto: the CPU has {} and the build has oneDNN", bf16_features(isa));
    } else {
      c.held_bf16 = HeldBf16Path::Bf16Sgemm;
      c.reason = have_onednn ? "auto: the CPU has no bf16 dot products (AVX512_BF16, AMX-BF16)"
                             : "auto: the build has no oneDNN";
    }
  } else {
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                fmt::format("[cpu gemm] runtime.cpu_gemm = '{}' is not one of auto, openblas, onednn", name));
  }
  return c;
}

}  // namespace

GemmEngineChoice cpu_gemm_choice() {
  auto& a = active();
  std::lock_guard<std::mutex> lock(a.mutex);
  if (!a.decided) {
    a.choice = decide("auto", cpu_isa(), onednn_built());
    a.decided = true;
  }
  return a.choice;
}

void select_cpu_gemm(std::string_view name) {
  // Forced oneDNN: make sure now, not at the first GEMM of a run, that it can multiply bf16 here.
  if (decide(name, cpu_isa(), onednn_built()).held_bf16 == HeldBf16Path::OneDnn && name == "onednn") {
    const uint16_t x[32] = {}, w[32] = {};
    float y[1] = {};
    onednn_bf16_gemm_xwt(x, w, 0.0f, y, 1, 1, 32);
  }
  select_cpu_gemm(name, cpu_isa(), onednn_built());
}

void select_cpu_gemm(std::string_view name, const CpuIsa& isa, bool have_onednn) {
  GemmEngineChoice c = decide(name, isa, have_onednn);
  auto& a = active();
  std::lock_guard<std::mutex> lock(a.mutex);
  a.choice = std::move(c);
  a.decided = true;
}

std::string describe_cpu_gemms(bool frozen_bf16) {
  std::string s;
  if (frozen_bf16) {
    const GemmEngineChoice c = cpu_gemm_choice();
    switch (c.held_bf16) {
      case HeldBf16Path::OneDnn:
        s = fmt::format(
            "GEMMs against weights held in bf16 (a bf16 base and a head tied to it, --matmul-dtype bf16 copies): bf16 "
            "inputs, f32 "
            "accumulate, oneDNN {} ({}); ",
            onednn_version(), c.reason);
        break;
      case HeldBf16Path::Bf16Sgemm:
        s = fmt::format(
            "GEMMs against weights held in bf16 (a bf16 base and a head tied to it, --matmul-dtype bf16 copies): bf16 "
            "inputs (x rounded, "
            "widened to f32), f32 "
            "accumulate, OpenBLAS sgemm ({}); ",
            c.reason);
        break;
      case HeldBf16Path::F32:
        s = fmt::format(
            "GEMMs against weights held in bf16 (a bf16 base and a head tied to it, --matmul-dtype bf16 copies): f32 "
            "inputs (weights "
            "widened), OpenBLAS sgemm ({}); ",
            c.reason);
        break;
    }
  }
  return s +
         "every other GEMM (f32 weights and heads, LoRA A/B, f16 and quantized weights widened to f32, attention, "
         "weight gradients): f32, OpenBLAS sgemm";
}

void onednn_bf16_gemm_xwt(const uint16_t* Xb, const uint16_t* W, float beta, float* C, int64_t M, int64_t N,
                          int64_t K) {
#ifdef BP_HAVE_ONEDNN
  if (M == 0 || N == 0) return;
  run_matmul(*matmul_for(0, M, N, K, beta), Xb, W, C);
#else
  no_onednn();
#endif
}

void onednn_bf16_gemm_xw(const uint16_t* Xb, const uint16_t* W, float beta, float* C, int64_t M, int64_t N, int64_t K) {
#ifdef BP_HAVE_ONEDNN
  if (M == 0 || K == 0) return;
  run_matmul(*matmul_for(1, M, N, K, beta), Xb, W, C);
#else
  no_onednn();
#endif
}

int64_t onednn_primitives_made() {
#ifdef BP_HAVE_ONEDNN
  return cache().made.load(std::memory_order_relaxed);
#else
  return 0;
#endif
}

int64_t onednn_cached_primitives() {
#ifdef BP_HAVE_ONEDNN
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return static_cast<int64_t>(c.prims.size());
#else
  return 0;
#endif
}

std::string onednn_last_impl() {
#ifdef BP_HAVE_ONEDNN
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.last_impl;
#else
  return "";
#endif
}

}  // namespace bp::cpu
