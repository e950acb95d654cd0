// Llama-3 rope scaling of a GGUF file, rebuilt for config.json (hub/gguf_source.h).
//
// llama.cpp's converter stores Llama-3.1/3.2 rope scaling (rope_scaling.rope_type "llama3") only as
// the tensor rope_freqs.weight: one divisor per rotary frequency (1 for high frequencies, `factor`
// for low ones, a smooth blend between), no metadata. Hugging Face's parameters (factor,
// low_freq_factor, high_freq_factor, original_max_position_embeddings) are recovered from it:
// the divisors fix `factor` and, per frequency with inverse wavelength y = L/wavelen, the band
// [low_freq_factor, high_freq_factor] in units of y; only the ratios to L are determined, so L is
// 8192 (Llama-3's value) and the canonical low 1 / high 4 are kept when they reproduce the divisors.
// Otherwise the band is solved from the divisors in the blend (two or more), or chosen between the
// neighbouring frequencies (fewer). The result is checked: every divisor it implies equals the
// stored one (relative 1e-4), else DEP_MODEL_LOAD_FAILED.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "io/gguf_reader.h"

namespace bp::hub {

// The rope_scaling object for config.json ({"rope_type": "llama3", ...}), or null when the file has
// no rope_freqs.weight or every divisor is 1. `theta` and `head_dim` are the file's rope settings;
// DEP_MODEL_LOAD_FAILED when head_dim is not even and at least 2, or the tensor does not hold head_dim / 2 values.
nlohmann::json llama3_rope_scaling_from_gguf(const GGUFReader& r, const std::string& path, double theta,
                                             int64_t head_dim);

}  // namespace bp::hub
