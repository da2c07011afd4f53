// Reads of the TorchScript IR that the bridge's passes share (defined in bridge.cc).
#pragma once
#include <torch/script.h>

#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

namespace fact::bridge {

// Whether `v` is a tensor.
bool is_tensor(const torch::jit::Value* v);

// Whether `v` has a name of its own, as a program built from a .pt2 names its values (TorchScript
// numbers the values it makes).
bool program_named(const torch::jit::Value* v);

// Whether node `n` reads its input `i` only for its metadata (sizes, dtype, device), never its data.
bool reads_metadata_only(const torch::jit::Node* n, size_t i);

// The chain of prim::GetAttr from the module (graph input 0) that `v` reads, outermost name first;
// nullopt where `v` is the module itself or is not read that way.
std::optional<std::vector<std::string>> attribute_path(torch::jit::Graph& g, torch::jit::Value* v);

// The dense tensor `v` reads where it is a module attribute: a buffer, or with `parameters` a
// parameter too; else nullopt.
std::optional<at::Tensor> state_read(torch::jit::Module& m, torch::jit::Graph& g, torch::jit::Value* v, bool parameters);

// `state_read` of buffers alone.
std::optional<at::Tensor> buffer_read(torch::jit::Module& m, torch::jit::Graph& g, torch::jit::Value* v);

// What may happen to the memory of `v` downstream: an op writes it (in place, through a view or
// a container), or the graph returns it.
struct Fate {
  bool written = false, returned = false;
};
Fate fate(const torch::jit::Graph& g, torch::jit::Value* v);

// The module's buffers and parameters that the forward writes through any of its reads.
std::vector<at::Tensor> written_state(torch::jit::Module& m, torch::jit::Graph& g);

// Whether `t` shares memory with one of `ts`.
bool shares_memory(const std::vector<at::Tensor>& ts, const at::Tensor& t);

// Computes once per key what a forward computes from its inputs' shapes and the module's buffers
// and parameters alone (memo.cc).
void memoize_static_values(torch::jit::Module& m, const std::shared_ptr<torch::jit::Graph>& g);

// A value the forward computes from the module's buffers, parameters and constants alone, read by
// a node whose value depends on more (the inputs, or their shapes), computed once here and read
// from a buffer of the module instead: `name` is the value's name in the graph, `attr` the
// buffer's attribute (memo.cc).
struct Folded {
  std::string name, attr;
  at::Tensor value;
};

// Folds every such value of at most `max_bytes` into a buffer of `m`, read where the value was;
// the nodes that computed it go. A value another computation the forward keeps reads through is
// not folded, nor one whose nodes fail to run here.
std::vector<Folded> fold_static_values(torch::jit::Module& m, const std::shared_ptr<torch::jit::Graph>& g,
                                       int64_t max_bytes);

// The nodes of the top-level block that memoization computes once per key rather than per forward
// (ops that compute a tensor of their own, fixed by the inputs' shapes and the module's buffers
// and parameters, not returned); none where the graph reshapes a tensor in place (memo.cc).
std::unordered_set<const torch::jit::Node*> memo_static_nodes(torch::jit::Module& m, torch::jit::Graph& g);

}  // namespace fact::bridge
