// A hook into every training pass's backward (Model::train_pass, transformer_backward.cpp): called
// on the calling thread once the head's backward is done (with num_layers) and after each layer's
// backward (l = num_layers−1 down to 0), when layer l's gradients are final for the pass. The
// data-parallel overlap (train/grad_overlap.h) starts reducing them there. Per thread; empty: none.
#pragma once

#include <cstdint>
#include <functional>

namespace bp {

void set_layer_backward_hook(std::function<void(int64_t layer)> hook);

}  // namespace bp
