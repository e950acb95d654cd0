// Vectorised dequantizers of ggml block formats for frozen weights held quantized
// (backend/cpu/quant_gemm.cpp), one copy per CPU kernel variant. Included by
// kernel_variants_impl.h inside the variant's anonymous namespace, after VecF, VecI, kLanes,
// load and store are defined; the same rules hold (always-inline helpers only, no std::).
//
// Each function turns `blocks` consecutive blocks into f32 with the formulas of the scalar
// reference (core/quant_blocks.cpp, byte layouts in io/quantize.h): q8_0, q4_0 and q5_0 are one
// product d·q per value, bit-identical to it; q4_K is d·sc·q − dmin·m, which a variant with FMA
// may fuse into one rounding (a difference of at most one rounding of the product).
// The f16 block scales convert with F16C where the variant has it, else with core's
// f16_to_f32 (an out-of-line function compiled for the baseline).

typedef uint8_t VecU8 __attribute__((vector_size(BP_KERNEL_VEC_BYTES / 4)));
typedef int8_t VecI8 __attribute__((vector_size(BP_KERNEL_VEC_BYTES / 4)));
typedef uint32_t VecU32 __attribute__((vector_size(BP_KERNEL_VEC_BYTES)));

template <class V>
[[gnu::always_inline]] inline V load_as(const uint8_t* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

[[gnu::always_inline]] inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
#if defined(BP_KERNEL_F16C)
  return _cvtsh_ss(h);
#else
  return ::bp::f16_to_f32(h);
#endif
}

// kLanes bytes widened to int32 lanes, then to float. The x86 widening instructions are named
// explicitly: GCC turns __builtin_convertvector from a byte vector into scalar code.
[[gnu::always_inline]] inline VecF u8_to_float(VecU8 q) {
#if BP_KERNEL_VEC_BYTES == 64
  __m128i b;
  std::memcpy(&b, &q, 16);
  // The zero-masked form: the plain one starts from _mm512_undefined, which GCC 12 at -O3 reports
  // as maybe-uninitialized.
  return __builtin_convertvector(reinterpret_cast<VecI>(_mm512_maskz_cvtepu8_epi32(0xFFFF, b)), VecF);
#elif BP_KERNEL_VEC_BYTES == 32 && defined(__AVX2__)
  uint64_t w;
  std::memcpy(&w, &q, 8);
  return reinterpret_cast<VecF>(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(w)))));
#elif BP_KERNEL_VEC_BYTES == 16 && defined(__SSE4_1__)
  int32_t w;
  std::memcpy(&w, &q, 4);
  return reinterpret_cast<VecF>(_mm_cvtepi32_ps(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(w))));
#else
  return __builtin_convertvector(__builtin_convertvector(q, VecI), VecF);
#endif
}

// kLanes signed bytes at p as floats.
[[gnu::always_inline]] inline VecF i8_to_float(const uint8_t* p) {
#if BP_KERNEL_VEC_BYTES == 64
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return __builtin_convertvector(reinterpret_cast<VecI>(_mm512_maskz_cvtepi8_epi32(0xFFFF, b)), VecF);
#elif BP_KERNEL_VEC_BYTES == 32 && defined(__AVX2__)
  return reinterpret_cast<VecF>(
      _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))));
#elif BP_KERNEL_VEC_BYTES == 16 && defined(__SSE4_1__)
  int32_t w;
  std::memcpy(&w, p, 4);
  return reinterpret_cast<VecF>(_mm_cvtepi32_ps(_mm_cvtepi8_epi32(_mm_cvtsi32_si128(w))));
#else
  return __builtin_convertvector(__builtin_convertvector(load_as<VecI8>(p), VecI), VecF);
#endif
}

// Q8_0, 34 bytes: f16 d; int8 q[32]; y = d·q.
void dequantize_q8_0(const uint8_t* src, float* dst, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, src += 34, dst += 32) {
    const float d = half_at(src);
    for (int64_t i = 0; i < 32; i += kLanes) store(dst + i, d * i8_to_float(src + 2 + i));
  }
}

// Q4_0, 18 bytes: f16 d; u8 qs[16]; y[j] = d·(lo nibble − 8), y[j + 16] = d·(hi nibble − 8).
void dequantize_q4_0(const uint8_t* src, float* dst, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, src += 18, dst += 32) {
    const float d = half_at(src);
    for (int64_t j = 0; j < 16; j += kLanes) {
      const VecU8 q = load_as<VecU8>(src + 2 + j);
      store(dst + j, d * (u8_to_float(q & 15) - 8.0f));
      store(dst + 16 + j, d * (u8_to_float(q >> 4) - 8.0f));
    }
  }
}

// Bit c of a 32-bit word in lane c (lanes beyond 16 are never read).
alignas(64) inline constexpr uint32_t kLaneBits[16] = {1u << 0,  1u << 1,  1u << 2,  1u << 3, 1u << 4,  1u << 5,
                                                       1u << 6,  1u << 7,  1u << 8,  1u << 9, 1u << 10, 1u << 11,
                                                       1u << 12, 1u << 13, 1u << 14, 1u << 15};

// Q5_0, 22 bytes: f16 d; u32 qh; u8 qs[16]; q = nibble | (bit of qh) << 4; y = d·(q − 16).
// (q − 16 is exact in f32, so d·(float(q) − 16) rounds once, as the reference's d·float(q − 16).)
void dequantize_q5_0(const uint8_t* src, float* dst, int64_t blocks) {
  VecU32 bits;
  std::memcpy(&bits, kLaneBits, sizeof bits);
  for (int64_t b = 0; b < blocks; ++b, src += 22, dst += 32) {
    const float d = half_at(src);
    uint32_t qh;
    std::memcpy(&qh, src + 2, 4);
    for (int64_t j = 0; j < 16; j += kLanes) {
      const VecU8 q = load_as<VecU8>(src + 6 + j);
      const VecU32 h = VecU32{} + qh;
      const VecI h0 = (((h >> static_cast<uint32_t>(j)) & bits) != 0) & 16;
      const VecI h1 = (((h >> static_cast<uint32_t>(j + 16)) & bits) != 0) & 16;
      // (nibble + high bit) − 16 is exact in f32, as the reference's int q − 16.
      store(dst + j, d * (u8_to_float(q & 15) + __builtin_convertvector(h0, VecF) - 16.0f));
      store(dst + 16 + j, d * (u8_to_float(q >> 4) + __builtin_convertvector(h1, VecF) - 16.0f));
    }
  }
}

// 6-bit scale and min of sub-block j from the 12-byte K-quant scale layout.
[[gnu::always_inline]] inline void k4_scale_min(const uint8_t* s, int j, int* sc, int* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Q4_K, 144 bytes: f16 d; f16 dmin; u8 scales[12]; u8 qs[128]. Chunk c of 32 bytes holds
// sub-block 2c in its low nibbles and 2c + 1 in its high ones; y = d·sc·q − dmin·m.
void dequantize_q4_k(const uint8_t* src, float* dst, int64_t blocks) {
  for (int64_t b = 0; b < blocks; ++b, src += 144, dst += 256) {
    const float d = half_at(src), dmin = half_at(src + 2);
    const uint8_t* qs = src + 16;
    for (int c = 0; c < 4; ++c) {
      int sc0, m0, sc1, m1;
      k4_scale_min(src + 4, 2 * c, &sc0, &m0);
      k4_scale_min(src + 4, 2 * c + 1, &sc1, &m1);
      const float d0 = d * static_cast<float>(sc0), o0 = dmin * static_cast<float>(m0);
      const float d1 = d * static_cast<float>(sc1), o1 = dmin * static_cast<float>(m1);
      float* y = dst + c * 64;
      for (int64_t l = 0; l < 32; l += kLanes) {
        const VecU8 q = load_as<VecU8>(qs + c * 32 + l);
        store(y + l, d0 * u8_to_float(q & 15) - o0);
        store(y + 32 + l, d1 * u8_to_float(q >> 4) - o1);
      }
    }
  }
}
