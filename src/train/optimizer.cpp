#include "train/optimizer.h"

#include <map>

#include "model/transformer.h"

namespace bp {

void AdamW::init(const std::vector<TrainableParam>& params) {
  names_.clear();
  m_.clear();
  v_.clear();
  for (const auto& p : params) {
    names_.push_back(p.name);
    m_.push_back(Tensor::zeros(p.param->shape(), DType::F32, p.param->device()));  // beside the parameter
    v_.push_back(Tensor::zeros(p.param->shape(), DType::F32, p.param->device()));
  }
  step_ = 0;
}

void AdamW::step(const std::vector<TrainableParam>& params, const AdamWConfig& cfg) {
  BP_CHECK(params.size() == m_.size(), "[adamw] {} parameters but state for {}", params.size(), m_.size());
  ++step_;
  std::vector<AdamWTensors> all;
  for (size_t i = 0; i < params.size(); ++i)
    all.push_back({params[i].param, params[i].grad, &m_[i], &v_[i], params[i].gemm_copy});
  adamw_step(all, cfg, step_);  // one kernel call for every tensor, bf16 GEMM copies included
}

std::vector<std::pair<std::string, Tensor>> AdamW::state_tensors() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < names_.size(); ++i) {
    out.emplace_back(names_[i] + ".exp_avg", m_[i]);
    out.emplace_back(names_[i] + ".exp_avg_sq", v_[i]);
  }
  return out;
}

void AdamW::load_state(const std::vector<std::pair<std::string, Tensor>>& tensors, int64_t step) {
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [n, t] : tensors) by_name[n] = &t;
  auto restore = [&](const std::string& name, Tensor& dst) {
    auto it = by_name.find(name);
    if (it == by_name.end())
      throw Error(ErrorCode::STATE_CHECKPOINT_INVALID, fmt::format("[adamw] optimizer state has no {}", name));
    if (!(it->second->shape() == dst.shape()))
      throw Error(ErrorCode::STATE_CHECKPOINT_INVALID,
                  fmt::format("[adamw] optimizer state {} has shape {}, the parameter has {}", name,
                              it->second->shape().str(), dst.shape().str()));
    dst.copy_from(*it->second);
  };
  for (size_t i = 0; i < names_.size(); ++i) {
    restore(names_[i] + ".exp_avg", m_[i]);
    restore(names_[i] + ".exp_avg_sq", v_[i]);
  }
  step_ = step;
}

}  // namespace bp
