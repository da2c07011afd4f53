// The C++ side of the TorchScript bridge: loads archives with libtorch, inlines `forward`, exports its
// IR with shapes, and rewrites matched nodes into custom-op calls. Every entry point catches C++
// exceptions and rethrows them as std::runtime_error so cxx turns them into Rust errors.
#pragma once
#include "rust/cxx.h"
#include <cstdint>

namespace fact::bridge {
struct InputSpec;
struct GraphDump;
struct OpFailure;
struct Edit;

rust::Vec<InputSpec> traced_inputs(rust::Str path);
GraphDump load_graph(rust::Str path, const rust::Vec<InputSpec>& inputs);
rust::String rewrite_and_save(rust::Str path, rust::Str out_path, const rust::Vec<Edit>& edits,
                              const rust::Vec<rust::String>& schemas);
rust::String graph_text(rust::Str path);
void save_fp64_copy(rust::Str path, rust::Str out_path);
rust::Vec<rust::String> archive_records(rust::Str path);
rust::Vec<uint8_t> archive_record(rust::Str path, rust::Str name, size_t limit);
void set_float32_matmul_precision(rust::Str mode);
rust::String float32_matmul_precision();
rust::String torch_version();
}  // namespace fact::bridge
