#include "train/optimizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>

#include "core/collective.h"
#include "model/transformer.h"

namespace bp {

namespace {

// A tensor's values as one row (a view).
Tensor flat(const Tensor& t) {
  return t.reshape(Shape{t.numel()});
}

// `count` host floats at `at` as a tensor (a view: nothing is copied or counted).
Tensor host_floats(float* at, int64_t count) {
  return Tensor::borrow(at, Shape{count}, DType::F32, nullptr);
}

}  // namespace

void AdamW::reset(const std::vector<TrainableParam>& params) {
  names_.clear();
  shapes_.clear();
  m_.clear();
  v_.clear();
  pieces_.clear();
  comm_ = nullptr;
  step_ = 0;
  for (const auto& p : params) {
    names_.push_back(p.name);
    shapes_.push_back(p.param->shape());
  }
}

void AdamW::init(const std::vector<TrainableParam>& params) {
  reset(params);
  for (const auto& p : params) {
    m_.push_back(Tensor::zeros(p.param->shape(), DType::F32, p.param->device()));  // beside the parameter
    v_.push_back(Tensor::zeros(p.param->shape(), DType::F32, p.param->device()));
  }
  step_ = 0;
}

void AdamW::init_sharded(const std::vector<TrainableParam>& params, Collective& comm) {
  reset(params);  // never the whole state, not even for a moment
  comm_ = &comm;
  starts_.clear();
  total_ = 0;
  for (const auto& p : params) {
    starts_.push_back(total_);
    total_ += p.param->numel();
  }
  const Device device = params.empty() ? Device{} : params[0].param->device();
  const size_t me = static_cast<size_t>(comm.rank());
  for (const Segment& seg : segments()) {
    const int64_t count = static_cast<int64_t>(seg.chunk_bytes[me] / sizeof(float));
    m_.push_back(Tensor::zeros(Shape{count}, DType::F32, device));
    v_.push_back(Tensor::zeros(Shape{count}, DType::F32, device));
  }
  std::vector<int64_t> sizes;
  for (const auto& p : params) sizes.push_back(p.param->numel());
  pieces_ = rank_runs(sizes, comm.rank(), comm.world());
}

std::vector<FlatRun> rank_runs(const std::vector<int64_t>& sizes, int rank, int world) {
  std::vector<FlatRun> out;
  std::vector<int64_t> starts;
  int64_t total = 0;
  for (int64_t n : sizes) {
    starts.push_back(total);
    total += n;
  }
  const auto W = static_cast<size_t>(world), me = static_cast<size_t>(rank);
  size_t chunk = 0;
  for (int64_t at = 0; at < total; at += static_cast<int64_t>(kReduceSegmentFloats), ++chunk) {
    const auto m = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(kReduceSegmentFloats), total - at));
    const int64_t begin = at + static_cast<int64_t>(m * me / W), end = at + static_cast<int64_t>(m * (me + 1) / W);
    // The tensors' runs inside [begin, end).
    for (size_t i = 0; i < sizes.size() && begin < end; ++i) {
      const int64_t b = std::max(starts[i], begin), e = std::min(starts[i] + sizes[i], end);
      if (b < e) out.push_back({i, b - starts[i], e - b, chunk, b - begin});
    }
  }
  return out;
}

std::vector<AdamW::Segment> AdamW::segments() const {
  std::vector<Segment> out;
  const size_t W = static_cast<size_t>(comm_->world());
  for (int64_t at = 0; at < total_; at += static_cast<int64_t>(kReduceSegmentFloats)) {
    Segment seg;
    seg.begin = at;
    seg.size = std::min<int64_t>(static_cast<int64_t>(kReduceSegmentFloats), total_ - at);
    const size_t m = static_cast<size_t>(seg.size);
    for (size_t q = 0; q < W; ++q) {  // the all-reduce's chunk q: [m·q/W, m·(q+1)/W)
      seg.chunk_offsets.push_back(m * q / W * sizeof(float));
      seg.chunk_bytes.push_back((m * (q + 1) / W - m * q / W) * sizeof(float));
    }
    out.push_back(std::move(seg));
  }
  return out;
}

int64_t AdamW::state_values() const {
  int64_t n = 0;
  for (const Tensor& t : m_) n += 2 * t.numel();
  return n;
}

void AdamW::step(const std::vector<TrainableParam>& params, const AdamWConfig& cfg) {
  ++step_;
  std::vector<AdamWTensors> all;
  if (!sharded()) {
    BP_CHECK(params.size() == m_.size(), "[adamw] {} parameters but state for {}", params.size(), m_.size());
    for (size_t i = 0; i < params.size(); ++i)
      all.push_back({params[i].param, params[i].grad, &m_[i], &v_[i], params[i].gemm_copy});
    adamw_step(all, cfg, step_);  // one kernel call for every tensor, bf16 GEMM copies included
    return;
  }
  BP_CHECK(params.size() == names_.size(), "[adamw] {} parameters but state for {}", params.size(), names_.size());
  // This rank's pieces: views of the parameter, gradient, GEMM copy and state (kept alive in `views`).
  std::vector<Tensor> views;
  views.reserve(pieces_.size() * 5);
  auto view = [&](Tensor t) {
    views.push_back(std::move(t));
    return &views.back();
  };
  for (const Piece& pc : pieces_) {
    const TrainableParam& p = params[pc.param];
    AdamWTensors a;
    a.param = view(flat(*p.param).rows(pc.offset, pc.offset + pc.count));
    a.grad = view(flat(*p.grad).rows(pc.offset, pc.offset + pc.count));
    a.m = view(m_[pc.chunk].rows(pc.chunk_at, pc.chunk_at + pc.count));
    a.v = view(v_[pc.chunk].rows(pc.chunk_at, pc.chunk_at + pc.count));
    if (p.gemm_copy) a.gemm_copy = view(flat(*p.gemm_copy).rows(pc.offset, pc.offset + pc.count));
    all.push_back(a);
  }
  adamw_step(all, cfg, step_);
  // Every rank's updated chunks to every rank: the parameters (and their GEMM copies) become the
  // owners' bits everywhere. Its time and bytes are the step records' comm_parameter_s/_bytes.
  const CommScope scope(CommKind::Parameters);
  exchange(
      [&](size_t chunk, float* out) {
        for (const Piece& pc : pieces_)
          if (pc.chunk == chunk)
            host_floats(out + pc.chunk_at, pc.count)
                .copy_from(flat(*params[pc.param].param).rows(pc.offset, pc.offset + pc.count));
      },
      [&](const Segment& seg, float* whole) {
        for (size_t i = 0; i < params.size(); ++i) {
          const int64_t pb = starts_[i], pe = pb + params[i].param->numel();
          const int64_t b = std::max(pb, seg.begin), e = std::min(pe, seg.begin + seg.size);
          if (b >= e) continue;
          Tensor dst = flat(*params[i].param).rows(b - pb, e - pb);
          dst.copy_from(host_floats(whole + (b - seg.begin), e - b));
          if (params[i].gemm_copy) flat(*params[i].gemm_copy).rows(b - pb, e - pb).copy_from(dst);
        }
      });
}

// Segment by segment: this rank's chunk of it, written by `mine(segment index, host floats)`,
// goes to every rank, and `whole(segment, host floats of the whole segment)` takes them all.
void AdamW::exchange(const std::function<void(size_t, float*)>& mine,
                     const std::function<void(const Segment&, float*)>& whole) {
  const size_t me = static_cast<size_t>(comm_->rank());
  const std::vector<Segment> segs = segments();
  std::vector<float> send, recv;
  for (size_t k = 0; k < segs.size(); ++k) {
    const Segment& seg = segs[k];
    send.assign(seg.chunk_bytes[me] / sizeof(float), 0.0f);
    recv.assign(static_cast<size_t>(seg.size), 0.0f);
    mine(k, send.data());
    comm_->all_gather_v_bytes(send.data(), seg.chunk_bytes[me], recv.data(), seg.chunk_bytes.data(),
                              seg.chunk_offsets.data());
    whole(seg, recv.data());
  }
}

std::vector<std::pair<std::string, Shape>> AdamW::state_layout() const {
  std::vector<std::pair<std::string, Shape>> out;
  for (const char* which : {".exp_avg", ".exp_avg_sq"})
    for (size_t i = 0; i < names_.size(); ++i) out.emplace_back(names_[i] + which, shapes_[i]);
  return out;
}

// m's segments, then v's: in the flat order of the parameters, so each segment's bytes follow the
// previous ones in the file.
void AdamW::stream_state(int root, const std::function<void(const void*, size_t)>* write) {
  BP_CHECK(sharded(), "[adamw] stream_state of an unsharded optimizer: use state_tensors");
  const bool keep = comm_->rank() == root && write;
  for (std::vector<Tensor>* state : {&m_, &v_})
    exchange([&](size_t chunk, float* out) { host_floats(out, (*state)[chunk].numel()).copy_from((*state)[chunk]); },
             [&](const Segment& seg, float* whole) {
               if (keep) (*write)(whole, static_cast<size_t>(seg.size) * sizeof(float));
             });
}

std::vector<std::pair<std::string, Tensor>> AdamW::state_tensors() const {
  BP_CHECK(!sharded(), "[adamw] state_tensors of a sharded optimizer: use stream_state");
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < names_.size(); ++i) out.emplace_back(names_[i] + ".exp_avg", m_[i]);
  for (size_t i = 0; i < names_.size(); ++i) out.emplace_back(names_[i] + ".exp_avg_sq", v_[i]);
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
  if (!sharded()) {
    for (size_t i = 0; i < names_.size(); ++i) {
      restore(names_[i] + ".exp_avg", m_[i]);
      restore(names_[i] + ".exp_avg_sq", v_[i]);
    }
    step_ = step;
    return;
  }
  // Sharded: the whole tensors are checked as above, then this rank's pieces of them are kept.
  for (size_t i = 0; i < names_.size(); ++i)
    for (const char* which : {".exp_avg", ".exp_avg_sq"}) {
      Tensor whole = Tensor::empty(shapes_[i], DType::F32);
      restore(names_[i] + which, whole);
      const bool first = std::strcmp(which, ".exp_avg") == 0;
      for (const Piece& pc : pieces_)
        if (pc.param == i)
          (first ? m_ : v_)[pc.chunk]
              .rows(pc.chunk_at, pc.chunk_at + pc.count)
              .copy_from(flat(whole).rows(pc.offset, pc.offset + pc.count));
    }
  step_ = step;
}

}  // namespace bp
