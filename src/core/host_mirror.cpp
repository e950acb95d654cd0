// Host copies of uploaded device memory (see host_mirror.h): a per-thread list of registered
// ranges, searched newest first (a handful of entries: one batch's four tensors per scope).
#include "core/host_mirror.h"

#include <algorithm>

#include "core/error.h"

namespace bp {

namespace {

struct MirrorEntry {
  const char* device_begin;
  size_t bytes;
  const char* host_begin;
  const HostMirrorScope* owner;
};
thread_local std::vector<MirrorEntry> g_mirrors;

}  // namespace

HostMirrorScope::HostMirrorScope(std::initializer_list<std::pair<const Tensor*, const Tensor*>> device_and_host) {
  for (const auto& [device, host] : device_and_host) {
    if (!device || !device->defined() || device->device().type == DeviceType::CPU) continue;
    BP_CHECK(host && host->device().type == DeviceType::CPU && host->nbytes() == device->nbytes(),
             "[host_mirror] the host copy of {} is {}", device->describe(), host ? host->describe() : "missing");
    held_.emplace_back(*device, *host);
    g_mirrors.push_back({static_cast<const char*>(device->kernel_raw()), device->nbytes(),
                         static_cast<const char*>(host->kernel_raw()), this});
  }
}

HostMirrorScope::~HostMirrorScope() {
  std::erase_if(g_mirrors, [this](const MirrorEntry& e) { return e.owner == this; });
}

const void* host_mirror(const void* device_ptr, size_t bytes) {
  const auto* p = static_cast<const char*>(device_ptr);
  for (auto it = g_mirrors.rbegin(); it != g_mirrors.rend(); ++it)
    if (p >= it->device_begin && bytes <= it->bytes && static_cast<size_t>(p - it->device_begin) <= it->bytes - bytes)
      return it->host_begin + (p - it->device_begin);
  return nullptr;
}

}  // namespace bp
