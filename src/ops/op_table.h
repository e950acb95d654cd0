// The ops x backends table for the docs (`backprop info --ops`), read from the dispatch tables
// (ops/dispatch.h, ops/kernels.inc): which backend has each kernel. Kept apart from dispatch.h so
// interfaces can print it without seeing backend headers.
#pragma once

#include <string>
#include <vector>

namespace bp::ops {

struct KernelSupport {
  std::string op;      // the front-end: ops/<op>.h
  std::string kernel;  // the backend function
  bool cpu = false, cuda = false;
};

std::vector<KernelSupport> kernel_support_table();
std::string kernel_support_markdown();  // docs/ops.md

}  // namespace bp::ops
