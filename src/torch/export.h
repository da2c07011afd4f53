// The torch.export front end's C++ half (export.cc), as the bridge uses it: a module built from a
// .pt2 program that the Rust side registered (register_export, bridge.h), loaded in place of a
// TorchScript archive by every bridge entry point.
#pragma once
#include "rust/cxx.h"

#include <torch/script.h>

#include <string>
#include <vector>

namespace fact::bridge {
// Whether `path` is a registered .pt2 archive.
bool is_export(const std::string& path);
// The module of a registered .pt2 archive (built anew: callers edit its graph), else the
// TorchScript archive at `path`, on the CPU.
torch::jit::Module load_module(const std::string& path);
// The sample inputs stored with a registered .pt2 archive (empty for other paths).
std::vector<at::Tensor> export_samples(const std::string& path);
// The placeholder name of attribute `attr` of a registered .pt2 archive's module ("" for an
// attribute the program does not have).
std::string export_placeholder(const std::string& path, const std::string& attr);
}  // namespace fact::bridge
