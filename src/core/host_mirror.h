// Host copies of device memory that the code which uploaded it keeps for a while, so that host
// code needing the values (the ops' argument checks of token ids, labels, positions and
// cu_seqlens; the CUDA cross-entropy's choice of label windows) reads the host's copy instead of
// copying the device's back: each such read makes the host wait for the card (a drained launch
// queue on a GPU), and a training step made several per layer.
//
// A HostMirrorScope registers pairs (device tensor, the host tensor it was uploaded from) for its
// lifetime, on this thread; host_mirror() finds the host bytes of any device range inside a
// registered tensor (views too). The contract of whoever registers: the device tensor is not
// written while the scope lives (the model registers its uploaded batch, which nothing writes).
// The scope holds both tensors, so neither can be freed and its memory reused under it.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace bp {

class HostMirrorScope {
 public:
  // Each pair: (device tensor, host tensor of the same bytes). Pairs whose first tensor is not on a
  // device (nothing to mirror) or is undefined are skipped.
  explicit HostMirrorScope(std::initializer_list<std::pair<const Tensor*, const Tensor*>> device_and_host);
  ~HostMirrorScope();
  HostMirrorScope(const HostMirrorScope&) = delete;
  HostMirrorScope& operator=(const HostMirrorScope&) = delete;

 private:
  std::vector<std::pair<Tensor, Tensor>> held_;
};

// The host copy of the `bytes` device bytes at `device_ptr` when a live scope of this thread
// registered a tensor holding all of them; nullptr otherwise (the caller copies them back).
const void* host_mirror(const void* device_ptr, size_t bytes);

}  // namespace bp
