// Overlap of the gradients' reduction with the backward pass (grad_overlap.h).
#include "train/grad_overlap.h"

#include <algorithm>
#include <chrono>
#include <regex>

namespace bp {

namespace {
// "...layers.<l>." in a trainable parameter's name (model weights and LoRA tensors alike).
int64_t layer_of(const std::string& name) {
  static const std::regex re(R"((^|\.)layers\.(\d+)\.)");
  std::smatch m;
  return std::regex_search(name, m, re) ? std::stoll(m[2].str()) : -1;
}
}  // namespace

GradientOverlap::GradientOverlap(Collective& comm, std::vector<Tensor*> grads, const std::vector<std::string>& names,
                                 int64_t layers, bool gather)
    : comm_(comm),
      grads_(std::move(grads)),
      gather_(gather),
      by_layer_(static_cast<size_t>(std::max<int64_t>(layers, 0))) {
  for (size_t i = 0; i < grads_.size(); ++i) {
    const int64_t l = layer_of(names[i]);
    if (l < 0 || l >= layers)
      rest_.push_back(i);
    else
      by_layer_[static_cast<size_t>(l)].push_back(i);
  }
  thread_ = std::thread([this] { run(); });
}

GradientOverlap::~GradientOverlap() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

double GradientOverlap::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void GradientOverlap::begin_step() {
  armed_ = used_ = spoiled_ = false;
}

void GradientOverlap::arm() {
  if (used_) return;
  armed_ = used_ = true;
  done_.assign(by_layer_.size(), false);
  backward.clear();
  reductions.clear();
  wait_s = 0;
  t0_ = last_ = now();
}

void GradientOverlap::layer_done(int64_t layer) {
  if (!armed_) return;
  const double t = now() - t0_;
  if (layer >= static_cast<int64_t>(by_layer_.size())) {  // the head's backward: where the layers' begins
    last_ = t;
    return;
  }
  backward.push_back({layer, last_, t});
  last_ = t;
  if (layer < 0 || done_[static_cast<size_t>(layer)]) return;
  done_[static_cast<size_t>(layer)] = true;
  if (!by_layer_[static_cast<size_t>(layer)].empty()) submit(by_layer_[static_cast<size_t>(layer)], layer);
}

void GradientOverlap::submit(std::vector<size_t> which, int64_t layer) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back({std::move(which), layer});
  }
  cv_.notify_all();
}

// The communication thread: the jobs in the order submitted (the same on every rank).
void GradientOverlap::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_
    Job job = std::move(queue_.front());
    queue_.pop_front();
    ++busy_;
    const bool skip = error_ != nullptr;  // after an error the rest is not attempted
    lock.unlock();
    const double b = now() - t0_;
    std::exception_ptr err;
    if (!skip) try {
        const CommScope scope(CommKind::Gradients);  // the step records' comm_gradient_s
        comm_.reduce_part(grads_, job.which, gather_);
      } catch (...) {
        err = std::current_exception();
      }
    const double e = now() - t0_;
    lock.lock();
    reductions.push_back({job.layer, b, e});
    if (err && !error_) error_ = err;
    --busy_;
    cv_.notify_all();
  }
}

void GradientOverlap::drain() {
  armed_ = false;
  // Whatever the hook did not submit, as the hook would have (every rank must run the same
  // collectives, a rank whose round an OOM cut short too): each layer not done, top first, then
  // what no layer owns (embeddings, norms, head).
  for (size_t l = by_layer_.size(); l-- > 0;)
    if (!done_[l] && !by_layer_[l].empty()) submit(by_layer_[l], static_cast<int64_t>(l));
  std::fill(done_.begin(), done_.end(), true);
  if (!rest_.empty()) submit(rest_, -1);
  const double b = now();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return queue_.empty() && busy_ == 0; });
  wait_s = now() - b;
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

bool GradientOverlap::finish() {
  if (armed_) drain();
  return used_ && !spoiled_;
}

void GradientOverlap::abandon() {
  if (!armed_) return;
  spoiled_ = true;
  drain();
}

double GradientOverlap::overlap_s() const {
  double s = 0;
  for (const Interval& r : reductions)
    for (const Interval& b : backward) s += std::max(0.0, std::min(r.end, b.end) - std::max(r.begin, b.begin));
  return s;
}

}  // namespace bp
