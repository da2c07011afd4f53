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
struct ExportProgram;
struct ExportRewrite;
struct ArchiveRecord;

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
// Keeps `program` (and its weights, read from the archive) for the .pt2 archive at `path`, whose
// module every entry point then loads (export.cc); fails, with the reason, where no module can be
// built from it.
void register_export(rust::Str path, const ExportProgram& program);
// Makes `edits` in the module of the registered .pt2 archive at `path` as rewrite_and_save does,
// and returns the rewritten program as the .pt2 writer (export/write.rs) takes it: each node the
// program's own or a call, and the buffers the calls read.
ExportRewrite rewrite_export(rust::Str path, const rust::Vec<Edit>& edits, const rust::Vec<rust::String>& schemas);
// Writes a zip archive as torch writes them (PyTorchStreamWriter) to `out_path`: the records of
// the archive `source` but those named in `skip`, then `add`.
void write_archive(rust::Str source, rust::Str out_path, const rust::Vec<rust::String>& skip,
                   const rust::Vec<ArchiveRecord>& add);
// Saves the module at `path` (a TorchScript archive, or a registered .pt2 archive's module) as a
// TorchScript archive at `out_path`.
void save_module(rust::Str path, rust::Str out_path);
}  // namespace fact::bridge
