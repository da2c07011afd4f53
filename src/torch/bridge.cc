// Implementation of the TorchScript bridge (see bridge.h and src/torch/mod.rs).
// Values and nodes are numbered in one deterministic walk of the inlined graph, so a later call
// that loads the same archive again can find the node a Rust rule matched by its index.
#include "fact/src/torch/bridge.h"
#include "fact/src/torch/export.h"
#include "fact/src/torch/mod.rs.h"
#include "fact/src/torch/mask_class.h"
#include "fact/src/torch/ir.h"

#include <iomanip>
#include <sstream>

#include <torch/library.h>
#include <torch/script.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/passes/lower_tuples.h>
#include <ATen/Context.h>
#include <torch/headeronly/version.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/jit/serialization/export.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <iomanip>
#include <sstream>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

namespace fact::bridge {
namespace {

using torch::jit::Block;
using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

std::string to_std(rust::Str s) { return std::string(s.data(), s.size()); }

// Runs f and turns every exception into std::runtime_error with a readable first line, since
// c10::Error's what() carries a C++ backtrace that would drown the user's message.
template <typename F>
auto guarded(const char* what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error& e) {
    throw std::runtime_error(std::string(what) + ": " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string(what) + ": " + e.what());
  }
}

// A file that torch's zip writer writes through. torch's writer keeps its own count of the bytes
// written; a short write (a full disk) would leave that count behind the file and make its
// destructor throw, which ends the process. So the sink takes every write, keeps the first
// failure, and `finish` reports it once the writer is done.
class FileSink {
 public:
  explicit FileSink(const std::string& path) : path_(path), file_(path, std::ios::binary | std::ios::trunc) {
    if (!file_) throw std::runtime_error("cannot open " + path + " for writing: " + std::strerror(errno));
  }
  std::function<size_t(const void*, size_t)> writer() {
    return [this](const void* buf, size_t n) {
      if (error_.empty()) {
        file_.write(static_cast<const char*>(buf), static_cast<std::streamsize>(n));
        if (!file_) error_ = std::strerror(errno);
      }
      return n;
    };
  }
  void finish() {
    if (error_.empty()) {
      file_.close();
      if (!file_) error_ = std::strerror(errno);
    }
    if (!error_.empty()) {
      throw std::runtime_error("writing " + path_ + " failed (" + error_ +
                               "): free space on its disk (df -h) or write the output elsewhere");
    }
  }

 private:
  std::string path_;
  std::ofstream file_;
  std::string error_;
};

// Saves a module through a FileSink, so that a full disk is an error and not an abort.
void save_whole(const torch::jit::Module& m, const std::string& path) {
  FileSink sink(path);
  torch::jit::ExportModule(m, sink.writer());
  sink.finish();
}

// A deterministic numbering of the inlined graph: graph inputs first, then every node's outputs in
// program order, descending into sub-blocks (If/Loop) before moving on.
struct Numbering {
  std::vector<Value*> values;
  std::vector<Node*> nodes;
  std::vector<uint32_t> depth;
  std::unordered_map<const Value*, uint32_t> id;
  // The node each value belongs to (its producer, or the node owning the block it enters), -1
  // for graph inputs; and each node's id.
  std::vector<int64_t> owner;
  std::unordered_map<const Node*, uint32_t> node_id;

  explicit Numbering(Graph& g) {
    for (Value* v : g.inputs()) add(v, -1);
    walk(g.block(), 0);
  }
  void add(Value* v, int64_t node) {
    id.emplace(v, static_cast<uint32_t>(values.size()));
    values.push_back(v);
    owner.push_back(node);
  }
  void walk(Block* b, uint32_t d) {
    for (Node* n : b->nodes()) {
      const auto i = static_cast<int64_t>(nodes.size());
      node_id.emplace(n, static_cast<uint32_t>(i));
      nodes.push_back(n);
      depth.push_back(d);
      for (Value* v : n->outputs()) add(v, i);
      for (Block* sub : n->blocks()) {
        for (Value* v : sub->inputs()) add(v, i);
        walk(sub, d + 1);
      }
    }
  }
  uint32_t of(const Value* v) const {
    auto it = id.find(v);
    if (it == id.end()) throw std::runtime_error("internal: value outside the numbering");
    return it->second;
  }
};

// ---------------------------------------------------------------------------------------------
// aten::_native_multi_head_attention, nn.MultiheadAttention's fast path (self-attention,
// batch_first, in eval without autograd: torchvision's ViT), is one node that hides two GEMMs and
// an attention from the rules. It is rewritten into the aten ops it computes, as torch's own
// kernel does on its SDPA path: linear in-projection ([3E] where q, k and v are one value, [2E]
// for one k and v, else the weight's row slices), heads split by view and transpose,
// aten::scaled_dot_product_attention (its default scale is the op's 1/sqrt(E/H)), heads merged
// by transpose and reshape, linear out-projection. The op treats a mask as boolean, true where a
// key is masked (a float mask: nonzero), and reads mask_type 0 as [Tq,Tk], 1 (key padding) as
// [B,Tk], 2 as [B,H,Tq,Tk]; SDPA's boolean mask is true where a key takes part, so the mask
// becomes logical_not(mask) (key padding: viewed as [B,1,1,Tk]). One difference remains: a row
// whose keys are all masked gives SDPA's 0 where torch's CPU kernel gives NaN. A node is left as
// it is where its weights output is used, or embed_dim, num_heads or a given mask's mask_type is
// no constant: nothing is guessed. Runs right after inlining, on every load of an archive (discover
// and the rewrite), so both number the same graph.

std::optional<int64_t> constant_int(Value* v) {
  auto iv = torch::jit::toIValue(v);
  if (iv && iv->isInt()) return iv->toInt();
  return std::nullopt;
}

bool is_none(Value* v) {
  auto iv = torch::jit::toIValue(v);
  return iv && iv->isNone();
}

bool decompose_native_mha_node(Graph& g, Node* n) {
  if (n->inputs().size() != 13 || n->outputs().size() != 2 || n->outputs()[1]->hasUses()) return false;
  const auto e = constant_int(n->input(3));
  const auto h = constant_int(n->input(4));
  if (!e || !h || *h <= 0 || *e % *h != 0) return false;
  Value* mask = n->input(9);
  const bool masked = !is_none(mask);
  const auto mask_type = constant_int(n->input(12));
  if (masked && (!mask_type || *mask_type < 0 || *mask_type > 2)) return false;

  using torch::jit::NamedValue;
  const int64_t E = *e, H = *h;
  torch::jit::WithInsertPoint guard(n);
  // The new nodes keep the module path of the one they replace (plans name it).
  torch::jit::WithCurrentScope scope(g, n->scope());
  auto op = [&](const char* name, std::vector<NamedValue> args) {
    return g.insert(c10::Symbol::fromQualString(name), args);
  };
  auto rows = [&](Value* t, int64_t from, int64_t to) {
    return op("aten::slice", {t, int64_t(0), from, to, int64_t(1)});
  };
  auto ints = [&](std::vector<Value*> elems) {
    return g.insertNode(g.createList(c10::IntType::get(), elems))->output();
  };
  auto unpack = [&](Value* list, size_t count) {
    auto outs = g.insertNode(g.createListUnpack(list, count))->outputs();
    return std::vector<Value*>(outs.begin(), outs.end());
  };
  Value *q = n->input(0), *k = n->input(1), *v = n->input(2);
  Value *w = n->input(5), *b = n->input(6);
  std::vector<Value*> qkv;
  if (q == k && k == v) {
    qkv = unpack(op("aten::chunk", {op("aten::linear", {q, w, b}), int64_t(3), int64_t(-1)}), 3);
  } else if (k == v) {
    qkv = {op("aten::linear", {q, rows(w, 0, E), rows(b, 0, E)})};
    auto kv = unpack(op("aten::chunk", {op("aten::linear", {k, rows(w, E, 3 * E), rows(b, E, 3 * E)}), int64_t(2),
                                        int64_t(-1)}),
                     2);
    qkv.insert(qkv.end(), kv.begin(), kv.end());
  } else {
    for (int64_t i = 0; i < 3; ++i) {
      qkv.push_back(op("aten::linear", {n->input(i), rows(w, i * E, (i + 1) * E), rows(b, i * E, (i + 1) * E)}));
    }
  }
  Value* batch = op("aten::size", {q, int64_t(0)});
  Value* minus_one = g.insertConstant(int64_t(-1));
  Value* heads = ints({batch, minus_one, g.insertConstant(H), g.insertConstant(E / H)});
  for (Value*& x : qkv) x = op("aten::transpose", {op("aten::view", {x, heads}), int64_t(1), int64_t(2)});
  Value* attend = nullptr;
  if (masked) {
    attend = op("aten::logical_not", {mask});
    if (*mask_type == 1) attend = op("aten::unsqueeze", {op("aten::unsqueeze", {attend, int64_t(1)}), int64_t(1)});
  }
  Value* none = g.insertConstant(c10::IValue());
  Value* y = op("aten::scaled_dot_product_attention",
                {qkv[0], qkv[1], qkv[2], masked ? NamedValue(attend) : NamedValue(none), 0.0, false});
  Value* rows_of_heads = op("aten::transpose", {y, int64_t(1), int64_t(2)});
  Value* merged = op("aten::reshape", {rows_of_heads, ints({batch, minus_one, g.insertConstant(E)})});
  Value* out = op("aten::linear", {merged, n->input(7), n->input(8)});
  n->outputs()[0]->replaceAllUsesWith(out);
  n->destroy();
  return true;
}

void decompose_native_mha(Graph& g) {
  static const auto kind = c10::Symbol::fromQualString("aten::_native_multi_head_attention");
  std::vector<Node*> found;
  for (Node* n : g.block()->nodes()) {
    if (n->kind() == kind) found.push_back(n);
  }
  for (Node* n : found) decompose_native_mha_node(g, n);
}

// The forward graph as the rules read it and the rewrite edits it (one function, so node ids
// agree): calls inlined, a tuple built and unpacked at once read as its elements (T5's first
// layer returns its projection beside the position bias that way), and the ops the rules read
// through rewritten as they compute.
void normalise(Graph& g) {
  torch::jit::Inline(g);
  torch::jit::LowerSimpleTuples(g.block());
  // The pass reads an unpacked element as the constructed value but leaves the pair behind: drop
  // the pairs nothing reads any more, so the values they held have their real readers only.
  for (auto it = g.nodes().rbegin(); it != g.nodes().rend();) {
    Node* n = *it;
    ++it;
    const bool tuple = n->kind() == c10::prim::TupleUnpack || n->kind() == c10::prim::TupleConstruct;
    const bool unread = std::all_of(n->outputs().begin(), n->outputs().end(), [](Value* v) { return !v->hasUses(); });
    if (tuple && unread) n->destroy();
  }
  decompose_native_mha(g);
}

// `forward`, normalised: what the rules see and the rewrite edits.
std::shared_ptr<Graph> inlined_forward(torch::jit::Module& m) {
  auto& fn = torch::jit::toGraphFunction(m.get_method("forward").function());
  auto g = fn.graph()->copy();
  normalise(*g);
  return g;
}

at::ScalarType parse_dtype(const std::string& s) {
  if (s == "f32") return at::kFloat;
  if (s == "f64") return at::kDouble;
  if (s == "bf16") return at::kBFloat16;
  if (s == "f16") return at::kHalf;
  if (s == "i64") return at::kLong;
  if (s == "i32") return at::kInt;
  if (s == "bool") return at::kBool;
  throw std::runtime_error("unsupported input dtype '" + s + "': use f32, bf16, f16, f64, i64, i32 or bool");
}

std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "f32";
    case at::kDouble: return "f64";
    case at::kBFloat16: return "bf16";
    case at::kHalf: return "f16";
    case at::kLong: return "i64";
    case at::kInt: return "i32";
    case at::kBool: return "bool";
    default: return std::string("other:") + c10::toString(t);
  }
}

std::string ivalue_repr(const c10::IValue& v) {
  std::ostringstream os;
  if (v.isNone()) return "None";
  if (v.isBool()) return v.toBool() ? "True" : "False";
  if (v.isString()) {
    os << '"' << v.toStringRef() << '"';
    return os.str();
  }
  if (v.isTensor()) {
    const auto& t = v.toTensor();
    if (!t.defined()) return "undefined";
    // A traced Python scalar in arithmetic is a 0-dim tensor constant: its value matters.
    if (t.dim() == 0 && !t.is_meta() && (t.is_floating_point() || t.scalar_type() == at::kLong || t.scalar_type() == at::kInt)) {
      os << std::setprecision(17) << "{" << t.item<double>() << "}";
      return os.str();
    }
    os << "tensor" << t.sizes() << ":" << dtype_name(t.scalar_type());
    return os.str();
  }
  if (v.isDevice()) return v.toDevice().str();
  os << v;
  return os.str();
}

// Large tensors become meta tensors (sizes only); 0-dim ones keep their value, because size
// arithmetic in traced graphs flows through them (NumToTensor, floor_divide, Int). An undefined
// tensor (an op's output it did not compute, as `_native_multi_head_attention`'s weights without
// need_weights) passes through: it has no device to ask about.
at::Tensor as_meta(const at::Tensor& t) {
  if (!t.defined() || t.is_meta() || t.dim() == 0) return t;
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta));
}

c10::IValue map_tensors(const c10::IValue& v, const std::function<at::Tensor(const at::Tensor&)>& f) {
  if (v.isTensor()) return f(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(f(t));
    return out;
  }
  // A list of optional tensors (aten::index's indices): its tensors too, its Nones as they are.
  if (v.isList()) {
    c10::impl::GenericList out(v.toList().elementType());
    for (const c10::IValue& e : v.toListRef()) out.push_back(e.isTensor() ? c10::IValue(f(e.toTensor())) : e);
    return out;
  }
  return v;
}

using Env = std::unordered_map<const Value*, c10::IValue>;
using TensorFn = std::function<at::Tensor(const at::Tensor&)>;

enum class Plumbing { None, Done, Failed };

// Runs a node that carries no registered operation (a constant, an attribute, list and tuple
// plumbing) over `env`, its tensors mapped by `f`: Done, Failed (an unpack that does not fit),
// or None for any other node.
Plumbing run_plumbing(Node* n, Env& env, const TensorFn& f) {
  if (n->kind() == c10::prim::Constant) {
    if (auto iv = torch::jit::toIValue(n->output())) env[n->output()] = map_tensors(*iv, f);
    return Plumbing::Done;
  }
  if (n->kind() == c10::prim::GetAttr) {
    const auto& obj = env.at(n->input());
    if (obj.isObject()) {
      env[n->output()] = map_tensors(obj.toObject()->getAttr(n->s(c10::attr::name)), f);
    }
    return Plumbing::Done;
  }
  if (n->kind() == c10::prim::ListConstruct) {
    auto elem = n->output()->type()->expectRef<c10::ListType>().getElementType();
    c10::impl::GenericList list(elem);
    for (Value* v : n->inputs()) list.push_back(env.at(v));
    env[n->output()] = c10::IValue(list);
    return Plumbing::Done;
  }
  if (n->kind() == c10::prim::TupleConstruct) {
    std::vector<c10::IValue> elems;
    for (Value* v : n->inputs()) elems.push_back(env.at(v));
    env[n->output()] = c10::ivalue::Tuple::create(std::move(elems));
    return Plumbing::Done;
  }
  if (n->kind() == c10::prim::ListUnpack || n->kind() == c10::prim::TupleUnpack) {
    const auto& in = env.at(n->input());
    std::vector<c10::IValue> elems;
    if (in.isTuple()) {
      for (const auto& e : in.toTupleRef().elements()) elems.push_back(e);
    } else if (in.isList()) {
      for (const c10::IValue& e : in.toListRef()) elems.push_back(e);
    }
    if (elems.size() != n->outputs().size()) return Plumbing::Failed;
    for (size_t i = 0; i < elems.size(); ++i) env[n->outputs()[i]] = elems[i];
    return Plumbing::Done;
  }
  return Plumbing::None;
}

// A list input of a failed node as record_failure shows it: printing the list itself would read
// the data of the meta tensors in it.
std::string list_repr(const c10::IValue& v) {
  std::string s;
  for (const c10::IValue& e : v.toListRef()) {
    std::string item = e.isTensor() ? "undefined" : ivalue_repr(e);
    if (e.isTensor() && e.toTensor().defined()) {
      std::string dims;
      for (auto d : e.toTensor().sizes()) dims += (dims.empty() ? "" : "x") + std::to_string(d);
      item = dims + ":" + dtype_name(e.toTensor().scalar_type());
    }
    s += (s.empty() ? "" : ", ") + item;
  }
  return "[" + s + "]";
}

// What a node that torch cannot run on the inputs was given, and what torch said (its first line:
// the rest of a c10::Error message is the C++ source location).
void record_failure(Node* n, const std::unordered_map<const Value*, c10::IValue>& env, const std::string& message,
                    OpFailure& failure) {
  if (!failure.kind.empty()) return;  // the first such node is the one that stopped propagation
  failure.kind = n->kind().toQualString();
  failure.scope = n->scopeName();
  for (Value* v : n->inputs()) {
    const c10::IValue& iv = env.at(v);
    if (iv.isTensor() && !iv.toTensor().defined()) {
      failure.inputs.push_back(rust::String("undefined"));
    } else if (iv.isTensor()) {
      const auto& t = iv.toTensor();
      std::string dims;
      for (auto d : t.sizes()) dims += (dims.empty() ? "" : "x") + std::to_string(d);
      failure.inputs.push_back(rust::String((t.dim() == 0 ? "scalar" : dims) + ":" + dtype_name(t.scalar_type())));
    } else if (iv.isList()) {
      failure.inputs.push_back(rust::String(list_repr(iv)));
    } else {
      failure.inputs.push_back(rust::String(ivalue_repr(iv)));
    }
  }
  failure.message = rust::String(message.substr(0, message.find('\n')));
}

// Interprets the inlined graph node by node on meta tensors (sizes and dtypes, no data) and records
// every tensor's shape. libtorch has meta kernels for the structured ops (mm, addmm, bmm, ...) but
// not for all (relu has none), so a node whose meta run fails runs once on uninitialised CPU
// tensors of the same sizes, and failing that on zeros (an index tensor of garbage fails embedding).
// A node that fails all three ways either fails on these inputs as torch would run them, or needs
// more than sizes (a data-dependent shape upstream, an op that checks values): `failure` names the
// first such node, and its outputs stay unknown like those of nodes with sub-blocks or without a
// registered operator; interpretation goes on, and everything downstream of them stays unknown.
// The caller decides which it was (src/torch/mod.rs: the archive's own inputs cannot be wrong).
// A custom op's outputs (a stand-in of export.cc: this libtorch cannot run it) as the program's
// metadata gives them, where the graph's inputs are the program's sample: false elsewhere.
bool custom_op_at_sample(Graph& g, Node* n, Env& env) {
  for (size_t i = 0; i + 1 < g.inputs().size(); ++i) {
    const std::string key = "fact_sample_" + std::to_string(i);
    auto it = env.find(g.inputs()[i + 1]);
    if (!n->hasAttributeS(key) || it == env.end() || !it->second.isTensor() ||
        it->second.toTensor().sizes().vec() != n->is(c10::Symbol::attr(key))) {
      return false;
    }
  }
  std::vector<at::Tensor> outs;
  for (size_t i = 0;; ++i) {
    const std::string k = std::to_string(i);
    if (!n->hasAttributeS("fact_sizes_" + k)) break;
    outs.push_back(at::empty_strided(n->is(c10::Symbol::attr("fact_sizes_" + k)), n->is(c10::Symbol::attr("fact_strides_" + k)),
                                     at::TensorOptions()
                                         .dtype(static_cast<at::ScalarType>(n->i(c10::Symbol::attr("fact_dtype_" + k))))
                                         .device(at::kMeta)));
  }
  if (n->outputs().size() == 1 && n->output()->type()->kind() == c10::TypeKind::ListType) {
    env[n->output()] = c10::IValue(c10::List<at::Tensor>(outs));
    return true;
  }
  if (outs.size() != n->outputs().size()) return false;
  for (size_t i = 0; i < outs.size(); ++i) env[n->outputs()[i]] = outs[i];
  return true;
}

std::unordered_map<const Value*, at::Tensor> capture_shapes(torch::jit::Module& module, Graph& g,
                                                             const rust::Vec<InputSpec>& inputs,
                                                             std::string& note, OpFailure& failure) {
  Env env;
  env[g.inputs()[0]] = module._ivalue();
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<int64_t> shape(inputs[i].shape.begin(), inputs[i].shape.end());
    auto dt = parse_dtype(std::string(inputs[i].dtype));
    env[g.inputs()[i + 1]] = at::empty(shape, at::TensorOptions().dtype(dt).device(at::kMeta));
  }
  std::vector<std::string> cpu_ops, unknown_ops;
  // The first node whose outputs stay unknown though its inputs are known, and why: where the
  // unknown shapes start (a failed run is `failure`'s).
  std::string first_unknown;
  auto unknown = [&](Node* n, const char* why) {
    unknown_ops.push_back(n->kind().toQualString());
    if (first_unknown.empty() && why != nullptr) {
      first_unknown = std::string(n->kind().toQualString()) + " (" + why + ")";
      if (!n->scopeName().empty()) first_unknown += " in " + n->scopeName();
    }
  };
  for (Node* n : g.nodes()) {
    bool inputs_known = true;
    for (Value* v : n->inputs()) inputs_known = inputs_known && env.count(v);
    if (!inputs_known) {
      unknown(n, nullptr);
      continue;
    }
    if (!n->blocks().empty()) {
      unknown(n, "control flow");
      continue;
    }
    switch (run_plumbing(n, env, as_meta)) {
      case Plumbing::Done: continue;
      case Plumbing::Failed: unknown(n, "its list or tuple does not unpack"); continue;
      case Plumbing::None: break;
    }
    // A device argument (a traced `device=x.device`, a `.to("cuda")`) names where the tensors of
    // this run live instead: a model traced on a GPU interprets without one.
    auto run = [&](const TensorFn& f, at::Device device) {
      torch::jit::Stack stack;
      for (Value* v : n->inputs()) {
        const c10::IValue& iv = env.at(v);
        stack.push_back(iv.isDevice() ? c10::IValue(device) : map_tensors(iv, f));
      }
      n->getOperation()(stack);
      for (size_t i = 0; i < n->outputs().size(); ++i) env[n->outputs()[i]] = map_tensors(stack[i], as_meta);
    };
    if (n->maybeOperator() == nullptr) {
      unknown(n, "no operator of this signature is registered");
      continue;
    }
    if (n->hasAttributeS("fact_custom_op")) {
      if (!custom_op_at_sample(g, n, env)) unknown(n, "a custom op of a Python library: its outputs are known at the program's sample only");
      continue;
    }
    try {
      run(as_meta, at::kMeta);
    } catch (const std::exception&) {
      try {
        run([](const at::Tensor& t) {
          return t.defined() && t.is_meta() ? at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kCPU))
                                            : t;
        }, at::kCPU);
        cpu_ops.push_back(n->kind().toQualString());
      } catch (const std::exception&) {
        try {
          run([](const at::Tensor& t) {
            return t.defined() && t.is_meta() ? at::zeros(t.sizes(), t.options().device(at::kCPU)) : t;
          }, at::kCPU);
          cpu_ops.push_back(n->kind().toQualString());
        } catch (const c10::Error& e) {
          record_failure(n, env, e.what_without_backtrace(), failure);
        } catch (const std::exception& e) {
          record_failure(n, env, e.what(), failure);
        }
      }
    }
  }
  auto list = [](std::vector<std::string> v) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
  };
  if (!unknown_ops.empty()) {
    note += "shapes unknown after: " + list(unknown_ops) + "; ";
    if (!first_unknown.empty()) note += "the first: " + first_unknown + "; ";
  }
  if (!cpu_ops.empty()) note += "ran on CPU for shapes (no meta kernel): " + list(cpu_ops);
  std::unordered_map<const Value*, at::Tensor> shapes;
  for (const auto& [v, iv] : env) {
    // An undefined tensor has no shape: its value stays unshaped, as a None would.
    if (iv.isTensor() && iv.toTensor().defined()) shapes.emplace(v, iv.toTensor());
  }
  return shapes;
}

struct MaskFactOut {
  std::string cls;
  bool shape_only;
};

// The value of `mask`, the mask of attention over q and k ([B,H,T,D] or [B,T,D]), evaluated on the
// CPU, and its class. The mask's
// producers run with real values: constants and module state as the archive holds them, a value
// read only for its metadata as an uninitialised tensor of its recorded size, and a graph input
// whose data is read as `examples` gives it (see load_graph). "unknown" when a producer cannot run
// that way.
MaskFactOut classify_mask(torch::jit::Module& module, Graph& g, Value* mask, const Value* q_value,
                          const Value* k_value, const std::unordered_map<const Value*, at::Tensor>& shapes,
                          const std::vector<at::Tensor>& examples) {
  // The values whose data the mask's value depends on, walking back from it.
  std::unordered_set<const Value*> data, metadata;
  std::vector<Value*> todo{mask};
  bool shape_only = true, evaluable = true;
  while (!todo.empty()) {
    Value* v = todo.back();
    todo.pop_back();
    if (!data.insert(v).second) continue;
    Node* p = v->node();
    if (p->kind() == c10::prim::Param) {
      if (v != g.inputs()[0]) shape_only = false;
      continue;
    }
    if (p->owningBlock() != g.block()) evaluable = false;
    for (size_t i = 0; i < p->inputs().size(); ++i) {
      if (reads_metadata_only(p, i)) {
        metadata.insert(p->input(i));
      } else {
        todo.push_back(p->input(i));
      }
    }
  }
  MaskFactOut unknown{"unknown", shape_only};
  auto q = shapes.find(q_value), k = shapes.find(k_value);
  if (!evaluable || q == shapes.end() || k == shapes.end()) return unknown;
  const at::Tensor &qs = q->second, &ks = k->second;
  if ((qs.dim() != 3 && qs.dim() != 4) || ks.dim() != qs.dim()) return unknown;
  Env env;
  env[g.inputs()[0]] = module._ivalue();
  for (size_t i = 1; i < g.inputs().size(); ++i) {
    if (!data.count(g.inputs()[i])) continue;
    if (i - 1 >= examples.size()) return unknown;
    env[g.inputs()[i]] = examples[i - 1];
  }
  const TensorFn as_is = [](const at::Tensor& t) { return t; };
  try {
    for (Node* n : g.block()->nodes()) {
      if (std::none_of(n->outputs().begin(), n->outputs().end(), [&](const Value* o) { return data.count(o) > 0; })) {
        continue;
      }
      for (Value* v : n->inputs()) {
        if (env.count(v)) continue;
        auto meta = shapes.find(v);
        if (!metadata.count(v) || meta == shapes.end()) return unknown;
        const at::Tensor& t = meta->second;
        env[v] = at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kCPU));
      }
      switch (run_plumbing(n, env, as_is)) {
        case Plumbing::Done: continue;
        case Plumbing::Failed: return unknown;
        case Plumbing::None: break;
      }
      if (!n->blocks().empty() || n->maybeOperator() == nullptr) return unknown;
      torch::jit::Stack stack;
      for (Value* v : n->inputs()) {
        const c10::IValue& iv = env.at(v);
        // A model traced on a GPU builds its mask there: build it on the CPU instead.
        stack.push_back(iv.isDevice() ? c10::IValue(at::Device(at::kCPU)) : iv);
      }
      n->getOperation()(stack);
      for (size_t i = 0; i < n->outputs().size(); ++i) env[n->outputs()[i]] = stack[i];
    }
  } catch (const std::exception&) {
    return unknown;
  }
  auto it = env.find(mask);
  if (it == env.end() || !it->second.isTensor()) return unknown;
  const at::Tensor m = it->second.toTensor();
  const auto mode = m.scalar_type() == at::kBool ? fact_mask::MaskMode::Bool : fact_mask::MaskMode::Additive;
  const auto value = fact_mask::classify(m, mode, qs.dim(), qs.size(0), qs.dim() == 4 ? qs.size(1) : 1,
                                         qs.size(-2), ks.size(-2));
  return {fact_mask::class_name(value.cls), shape_only};
}

// The masks an explicit attention adds to its scores before the softmax `softmax` (GPT-J's
// `softmax(q·kᵀ / s + mask)`, any scale, q and k as the product reads them), with the q and k of
// that product: false when the softmax reads no such sum. GPT-Neo's scores go through
// `where(cond, scores, fill)` before the add: `cond` is that condition (else null). CodeGen's
// sum is scaled after the add: `softmax((q·kᵀ + mask) / s)`. MPNet adds two terms in turn,
// `(q·kᵀ / s + bias) + mask` (the first in place): both are in `masks`, for the rule to tell
// which one is of a class the kernels compute.
bool added_masks(Node* softmax, std::vector<Value*>& masks, Value*& q, Value*& k, Value*& cond) {
  auto is_add = [](Node* n) {
    return (n->kind() == c10::aten::add || n->kind() == c10::aten::add_) && n->inputs().size() == 3;
  };
  // The scaled product (through GPT-Neo's where) that `n` is: its q and k.
  auto product = [&](Node* s) {
    cond = nullptr;
    if (s->kind() == c10::aten::where && s->inputs().size() == 3) {
      cond = s->input(0);
      s = s->input(1)->node();
    }
    if (s->kind() == c10::aten::mul || s->kind() == c10::aten::div) s = s->input(0)->node();
    if (s->kind() != c10::aten::matmul) return false;
    Node* t = s->input(1)->node();
    if (t->kind() != c10::aten::transpose) return false;
    q = s->input(0);
    k = t->input(0);
    return true;
  };
  Node* add = softmax->input(0)->node();
  if ((add->kind() == c10::aten::mul || add->kind() == c10::aten::div) && add->inputs().size() == 2) {
    add = add->input(0)->node();
  }
  if (!is_add(add)) return false;
  masks.clear();
  for (size_t side : {0, 1}) {
    Node* s = add->input(side)->node();
    if (product(s)) {
      masks.push_back(add->input(1 - side));
      return true;
    }
    if (!is_add(s)) continue;
    for (size_t inner : {0, 1}) {
      if (!product(s->input(inner)->node())) continue;
      masks = {s->input(1 - inner), add->input(1 - side)};
      return true;
    }
  }
  return false;
}

// The class of every SDPA call's mask and every mask an explicit attention adds to its scores
// (one entry per mask value: layers share theirs).
std::unordered_map<const Value*, MaskFactOut> classify_masks(torch::jit::Module& module, Graph& g,
                                                             const std::unordered_map<const Value*, at::Tensor>& shapes,
                                                             const std::vector<at::Tensor>& examples) {
  std::unordered_map<const Value*, MaskFactOut> facts;
  for (Node* n : g.block()->nodes()) {
    Value *q = nullptr, *k = nullptr, *cond = nullptr;
    std::vector<Value*> masks;
    if (n->kind() == c10::aten::scaled_dot_product_attention && n->inputs().size() >= 4) {
      Value* mask = n->input(3);
      masks = {mask};
      q = n->input(0);
      k = n->input(1);
      // Hugging Face's SDPA integration selects a position bias by a bool mask (T5's
      // `where(mask, bias, finfo.min)`): that mask is classified too, for the rule to read.
      Node* w = mask->node();
      if (w->kind() == c10::aten::where && w->inputs().size() == 3) {
        auto it = shapes.find(w->input(0));
        if (it != shapes.end() && it->second.scalar_type() == at::kBool) cond = w->input(0);
      }
    } else if (n->kind() != c10::aten::softmax || !added_masks(n, masks, q, k, cond)) {
      continue;
    }
    if (cond != nullptr && !facts.count(cond)) facts.emplace(cond, classify_mask(module, g, cond, q, k, shapes, examples));
    for (Value* mask : masks) {
      if (mask->mustBeNone() || facts.count(mask)) continue;
      facts.emplace(mask, classify_mask(module, g, mask, q, k, shapes, examples));
    }
  }
  return facts;
}

// The example inputs of `forward` a traced archive stores (empty when it stores none).
// torch::jit::load does not restore them, so the archive record is read directly. torch.jit.trace
// (torch 2.11) writes their sizes and dtypes but zero-byte data records: such a tensor comes back
// with no data (`has_values` tells).
std::vector<at::Tensor> traced_tensors(const std::string& path) {
  if (is_export(path)) return export_samples(path);
  caffe2::serialize::PyTorchStreamReader reader(path);
  std::vector<at::Tensor> out;
  if (!reader.hasRecord("traced_inputs.pkl")) return out;
  c10::IValue all = torch::jit::readArchiveAndTensors("traced_inputs", "", "traced_inputs/", std::nullopt,
                                                      std::nullopt, at::Device(at::kCPU), reader);
  if (!all.isGenericDict()) return out;
  for (const auto& entry : all.toGenericDict()) {
    if (!entry.key().isString() || entry.key().toStringRef() != "forward") continue;
    if (!entry.value().isList()) throw std::runtime_error("traced inputs of forward are not a list");
    for (const c10::IValue& v : entry.value().toListRef()) {
      if (!v.isTensor()) throw std::runtime_error("a traced input is not a tensor; give the inputs with --input");
      out.push_back(v.toTensor());
    }
  }
  return out;
}

bool has_values(const at::Tensor& t) {
  return t.numel() == 0 || (t.storage().data() != nullptr &&
                            t.storage().nbytes() >= static_cast<size_t>((t.storage_offset() + t.numel()) * t.element_size()));
}

}  // namespace

// Whether node `n` reads its input `i` only for its metadata (sizes, dtype, device), never its
// data: a mask built from `new_ones(x, ..)` and `x.size(1)` is a function of x's shape alone.
bool is_tensor(const Value* v) { return v->type()->isSubtypeOf(*c10::TensorType::get()); }

bool program_named(const Value* v) {
  const std::string& s = v->debugName();
  return !s.empty() && !std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
}

bool reads_metadata_only(const Node* n, size_t i) {
  static const std::unordered_set<std::string> kinds = {
      "aten::size",     "aten::sym_size",  "aten::dim",      "aten::numel",     "prim::device",
      "prim::dtype",    "prim::layout",    "aten::new_ones", "aten::new_zeros", "aten::new_empty",
      "aten::new_full", "aten::ones_like", "aten::zeros_like", "aten::empty_like", "aten::full_like"};
  return i == 0 && kinds.count(n->kind().toQualString()) > 0;
}


rust::Vec<InputSpec> traced_inputs(rust::Str path) {
  return guarded("cannot read the traced inputs", [&] {
    rust::Vec<InputSpec> out;
    for (const at::Tensor& t : traced_tensors(to_std(path))) {
      InputSpec s;
      for (auto d : t.sizes()) s.shape.push_back(d);
      s.dtype = dtype_name(t.scalar_type());
      out.push_back(std::move(s));
    }
    return out;
  });
}

GraphDump load_graph(rust::Str path, const rust::Vec<InputSpec>& inputs) {
  return guarded("cannot load the TorchScript graph", [&] {
    auto m = load_module(to_std(path));
    m.eval();
    auto g = inlined_forward(m);
    Numbering num(*g);
    GraphDump dump;
    if (g->inputs().size() != inputs.size() + 1) {
      throw std::runtime_error("forward takes " + std::to_string(g->inputs().size() - 1) + " inputs, " +
                               std::to_string(inputs.size()) + " given: pass one --input per forward input");
    }
    std::string note;
    auto shapes = capture_shapes(m, *g, inputs, note, dump.failure);
    dump.note = rust::String(note);
    // A mask read from input data is evaluated on the example values where the archive holds them
    // at these shapes, else on inputs of ones: Hugging Face's attention_mask with nothing padded
    // (torch.jit.trace stores no values). Either way a sample: the fact says the mask reads data.
    std::vector<at::Tensor> examples;
    try {
      examples = traced_tensors(to_std(path));
    } catch (const std::exception&) {
      // Inputs that are not all tensors: --input gave the shapes.
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      const std::vector<int64_t> shape(inputs[i].shape.begin(), inputs[i].shape.end());
      const bool stored = i < examples.size() && examples[i].sizes().vec() == shape &&
                          dtype_name(examples[i].scalar_type()) == std::string(inputs[i].dtype) &&
                          has_values(examples[i]);
      const auto dt = parse_dtype(std::string(inputs[i].dtype));
      const at::Tensor value = stored ? examples[i].clone() : at::ones(shape, at::TensorOptions().dtype(dt));
      if (i < examples.size()) {
        examples[i] = value;
      } else {
        examples.push_back(value);
      }
    }
    examples.resize(inputs.size());
    const auto masks = dump.failure.kind.empty() ? classify_masks(m, *g, shapes, examples)
                                                 : std::unordered_map<const Value*, MaskFactOut>{};
    // What the composed module's memo will compute once per shape (the plan counts it apart).
    std::unordered_set<const Node*> memo_nodes;
    try {
      memo_nodes = memo_static_nodes(m, *g);
    } catch (const std::exception&) {
      // The plan then counts every node per forward, as it did before.
    }
    for (Value* v : num.values) {
      ValueInfo vi;
      vi.name = v->debugName();
      vi.ty = v->type()->repr_str();
      vi.has_shape = false;
      auto it = shapes.find(v);
      if (it != shapes.end()) {
        vi.has_shape = true;
        for (auto d : it->second.sizes()) vi.shape.push_back(d);
        // Views keep their strides on meta tensors: the rules read layouts from them.
        for (auto d : it->second.strides()) vi.strides.push_back(d);
        vi.dtype = dtype_name(it->second.scalar_type());
      }
      vi.mask_shape_only = false;
      auto fact = masks.find(v);
      if (fact != masks.end()) {
        vi.mask = rust::String(fact->second.cls);
        vi.mask_shape_only = fact->second.shape_only;
      }
      dump.values.push_back(std::move(vi));
    }
    for (size_t i = 0; i < num.nodes.size(); ++i) {
      Node* n = num.nodes[i];
      NodeInfo ni;
      ni.kind = n->kind().toQualString();
      ni.depth = num.depth[i];
      for (Value* v : n->inputs()) ni.inputs.push_back(num.of(v));
      for (Value* v : n->outputs()) ni.outputs.push_back(num.of(v));
      if (n->kind() == c10::prim::Constant) {
        auto iv = torch::jit::toIValue(n->output());
        ni.constant = iv ? rust::String(ivalue_repr(*iv)) : rust::String("?");
      }
      ni.scope = n->scopeName();
      ni.memo = memo_nodes.count(n) > 0;
      dump.nodes.push_back(std::move(ni));
    }
    for (Value* v : g->inputs()) dump.inputs.push_back(num.of(v));
    for (Value* v : g->outputs()) dump.outputs.push_back(num.of(v));
    return dump;
  });
}

// Saving prints the graph as code, which needs the schema of every op it calls. The op libraries
// define fact's schemas only where nothing did before, so defining them here first is compatible
// with loading an op library into this process later.
void ensure_schemas(const rust::Vec<rust::String>& schemas) {
  static std::vector<std::unique_ptr<torch::Library>> libs;
  for (const auto& schema : schemas) {
    std::string s(schema);
    std::string name = s.substr(0, s.find('('));
    if (c10::Dispatcher::singleton().findSchema({"fact::" + name, ""}).has_value()) continue;
    libs.push_back(std::make_unique<torch::Library>(torch::Library::FRAGMENT, "fact", std::nullopt, __FILE__,
                                                    static_cast<uint32_t>(__LINE__)));
    libs.back()->def(torch::schema(s.c_str()));
  }
}

std::string node_label(uint32_t id, const Node* n) {
  return "node " + std::to_string(id) + " (" + n->kind().toQualString() + ")";
}

// Checks that node `id` of the numbering exists, was not destroyed by an earlier edit, and is of
// kind `expect`; returns it.
Node* expect_node(const Numbering& num, const std::vector<bool>& destroyed, uint32_t id, const std::string& expect) {
  if (id >= num.nodes.size()) throw std::runtime_error("edit names node " + std::to_string(id) + " beyond the graph");
  Node* n = num.nodes[id];
  if (destroyed[id]) {
    throw std::runtime_error("node " + std::to_string(id) + " is in two edits: their patterns overlap");
  }
  if (std::string(n->kind().toQualString()) != expect) {
    throw std::runtime_error(node_label(id, n) + " is not the expected " + expect + " (the archive changed?)");
  }
  return n;
}

// A size read through a cast (`aten::size(to(x, f32), d)`: GPT-Neo reads its q's and k's lengths
// off their fp32 copies) reads x instead, whose sizes are the cast's; a cast then left unread
// goes. An attention pattern that took the casts' other readers left them for their sizes alone:
// each would still copy q or k to fp32 on every forward for nothing.
void sizes_before_casts(Graph& g) {
  std::vector<Node*> casts;
  for (Node* n : g.block()->nodes()) {
    if (n->kind() != c10::aten::size || n->inputs().empty()) continue;
    Node* c = n->input(0)->node();
    if (c->kind() != c10::aten::to || c->outputs().size() != 1 || !is_tensor(c->input(0))) continue;
    n->replaceInput(0, c->input(0));
    casts.push_back(c);
  }
  std::unordered_set<Node*> gone;
  for (Node* c : casts) {
    if (c->output()->uses().empty() && gone.insert(c).second) c->destroy();
  }
}

// Tracing records shape arithmetic such as `c // h` as 0-d tensor ops: the size enters through
// prim::NumToTensor (a CPU tensor) and the Python int through a 0-d tensor constant. Loading the
// archive with map_location="cuda" moves that constant to the GPU, which moves the arithmetic
// there, and the aten::Int that takes the result back into a view's sizes then copies it to the
// host and waits for the whole stream: the GPU idles for every op the host issues after it
// (measured on the composed GPT block: 0.25-0.3 ms per forward). Such a constant is replaced by
// prim::NumToTensor of the same number, a host tensor of the same dtype wherever the module is
// loaded. Only constants every use of which is this arithmetic are replaced: a constant that also
// meets model tensors keeps its device.
void host_shape_arithmetic(Graph& g) {
  static const std::unordered_set<c10::Symbol> arithmetic = {
      c10::aten::floor_divide, c10::aten::div, c10::aten::mul, c10::aten::add, c10::aten::sub,
      c10::aten::pow, c10::aten::remainder, c10::aten::floordiv, c10::aten::true_divide};
  auto scalar_constant = [](const Value* v) {
    if (v->node()->kind() != c10::prim::Constant || !is_tensor(v)) return false;
    const auto t = torch::jit::toIValue(v);
    if (!t || !t->isTensor()) return false;
    const at::Tensor& x = t->toTensor();
    return x.dim() == 0 && !x.requires_grad() && (x.scalar_type() == at::kLong || x.scalar_type() == at::kDouble);
  };
  // Values the host computes from sizes: NumToTensor outputs and arithmetic over them and scalar
  // constants. Only the top-level block: traced graphs have no control flow.
  std::unordered_set<const Value*> host;
  std::vector<Value*> constants;
  for (Node* n : g.block()->nodes()) {
    if (n->kind() == c10::prim::NumToTensor) {
      host.insert(n->output());
      continue;
    }
    if (!arithmetic.count(n->kind()) || n->outputs().size() != 1) continue;
    bool from_sizes = false, all_host = true;
    std::vector<Value*> consts;
    for (Value* v : n->inputs()) {
      if (!is_tensor(v)) continue;
      if (host.count(v)) {
        from_sizes = true;
      } else if (scalar_constant(v)) {
        consts.push_back(v);
      } else {
        all_host = false;
      }
    }
    if (!from_sizes || !all_host) continue;
    host.insert(n->output());
    constants.insert(constants.end(), consts.begin(), consts.end());
  }
  std::unordered_set<Value*> done;
  for (Value* c : constants) {
    if (!done.insert(c).second) continue;
    const bool only_arithmetic = std::all_of(c->uses().begin(), c->uses().end(), [&](const torch::jit::Use& u) {
      return u.user->outputs().size() == 1 && host.count(u.user->output());
    });
    if (!only_arithmetic) continue;
    const at::Tensor x = torch::jit::toIValue(c)->toTensor();
    torch::jit::WithInsertPoint guard(c->node()->next());
    Value* number = x.scalar_type() == at::kLong ? g.insertConstant(x.item<int64_t>()) : g.insertConstant(x.item<double>());
    Node* to_tensor = g.insertNode(g.createNumToTensor(number));
    c->replaceAllUsesWith(to_tensor->output());
    c->node()->destroy();
  }
}

// Module buffers of equal value read as one. Models built layer by layer keep a copy of a constant
// table in every layer (GPT-J's `embed_positions`, the sinusoids each attention block turns into
// its rotary cos and sin): the same ops then run on the same values once per layer, each a launch
// and host work the GPU waits on. Where every layer reads the first layer's buffer instead, those
// ops read the same values, and TorchScript's own common-subexpression pass (which its executor
// runs before a module's first optimized forward) computes them once. Only tensor attributes that
// are no parameter, compared by dtype, device, shape, strides and every element, and only where
// nothing downstream of either read is an op that writes its input: a buffer that the graph
// mutates (in place, through a view) keeps its own read. The composed module holds the values the
// archive held, as the weights it concatenates or folds do. Only the top-level block (traced
// graphs have no control flow); the reads left without uses are removed.
// The chain of prim::GetAttr from the module (graph input 0) that `v` reads, outermost name first;
// nullopt where `v` is the module itself or is not read that way.
std::optional<std::vector<std::string>> attribute_path(Graph& g, Value* v) {
  if (v == g.inputs()[0]) return std::nullopt;
  std::vector<std::string> path;
  for (Value* at = v; at != g.inputs()[0]; at = at->node()->input(0)) {
    if (at->node()->kind() != c10::prim::GetAttr) return std::nullopt;
    path.insert(path.begin(), at->node()->s(c10::attr::name));
  }
  return path;
}

// The module attribute at `path` (`attribute_path`), whether it is a parameter, and the name that
// joins its path (`mlp_gate_proj_weight`); nullopt where a step is no attribute of an object.
struct ModuleAttribute {
  c10::IValue value;
  bool parameter = false;
  std::string name;
};

std::optional<ModuleAttribute> find_attribute(torch::jit::Module& m, const std::vector<std::string>& path) {
  ModuleAttribute a;
  a.value = m._ivalue();
  for (const auto& step : path) {
    if (!a.value.isObject()) return std::nullopt;
    const auto obj = a.value.toObject();
    const auto slot = obj->type()->findAttributeSlot(step);
    if (!slot) return std::nullopt;
    a.parameter = obj->type()->is_parameter(*slot);
    a.value = obj->getSlot(*slot);
    a.name += (a.name.empty() ? "" : "_") + step;
  }
  return a;
}

// Dense tensors only: `equal` is defined for them (a sparse or quantized buffer keeps its read).
std::optional<at::Tensor> state_read(torch::jit::Module& m, Graph& g, Value* v, bool parameters) {
  const auto path = attribute_path(g, v);
  const auto a = path ? find_attribute(m, *path) : std::nullopt;
  if (!a || (a->parameter && !parameters) || !a->value.isTensor() || !a->value.toTensor().defined()) {
    return std::nullopt;
  }
  const at::Tensor& t = a->value.toTensor();
  if (t.layout() != at::kStrided || t.is_quantized() || t.is_meta()) return std::nullopt;
  return t;
}

std::optional<at::Tensor> buffer_read(torch::jit::Module& m, Graph& g, Value* v) { return state_read(m, g, v, false); }

// What may happen to the memory of `v` downstream: an op writes it (in place, through a view or
// a container), or the graph returns it. Follows the uses that may alias `v` (an op's argument
// with an alias annotation, as views have; a node without a schema, as lists and tuples are);
// an op whose argument has none makes a new tensor of it. Unlike the alias analysis of
// TorchScript, which takes every module attribute for one "wildcard", this tells one buffer from
// another.
Fate fate(const Graph& g, Value* v) {
  Fate f;
  std::vector<Value*> todo = {v};
  std::unordered_set<Value*> seen = {v};
  while (!todo.empty() && !f.written) {
    Value* at = todo.back();
    todo.pop_back();
    for (const torch::jit::Use& u : at->uses()) {
      if (u.user == g.return_node()) {
        f.returned = true;
        continue;
      }
      const c10::FunctionSchema* schema = u.user->maybeSchema();
      bool aliases = true;
      if (schema != nullptr && u.offset < schema->arguments().size()) {
        const c10::AliasInfo* info = schema->arguments()[u.offset].alias_info();
        if (info != nullptr && info->isWrite()) f.written = true;
        aliases = info != nullptr;
      } else if (schema == nullptr && u.user->kind().is_aten()) {
        f.written = true;  // an op of unknown effects
      } else if (!u.user->blocks().empty()) {
        f.written = true;  // control flow: anything may happen to it
      }
      if (!aliases) continue;
      for (Value* out : u.user->outputs()) {
        if (seen.insert(out).second) todo.push_back(out);
      }
    }
  }
  return f;
}

std::vector<at::Tensor> written_state(torch::jit::Module& m, Graph& g) {
  std::vector<at::Tensor> written;
  for (Node* n : g.block()->nodes()) {
    if (n->kind() != c10::prim::GetAttr || !is_tensor(n->output())) continue;
    const std::optional<at::Tensor> t = state_read(m, g, n->output(), true);
    if (t && fate(g, n->output()).written) written.push_back(*t);
  }
  return written;
}

bool shares_memory(const std::vector<at::Tensor>& ts, const at::Tensor& t) {
  return std::any_of(ts.begin(), ts.end(), [&](const at::Tensor& u) { return u.is_alias_of(t); });
}

void pool_equal_buffers(torch::jit::Module& m, Graph& g) {
  const std::vector<at::Tensor> written = written_state(m, g);
  // Buffers read so far, by dtype and shape: the tensor and the value that reads it.
  std::unordered_map<std::string, std::vector<std::pair<at::Tensor, Value*>>> first;
  for (auto it = g.block()->nodes().begin(); it != g.block()->nodes().end();) {
    Node* n = *it;
    if (n->kind() != c10::prim::GetAttr || !is_tensor(n->output()) ||
        !n->output()->hasUses()) {
      ++it;
      continue;
    }
    // A buffer the graph returns (through a view, a list or a tuple) keeps its read: the caller
    // may hold on to it, and should get the buffer it asked for. So does one the forward writes,
    // through this read or another.
    const Fate f = fate(g, n->output());
    const std::optional<at::Tensor> t = f.returned || f.written ? std::nullopt : buffer_read(m, g, n->output());
    if (!t || shares_memory(written, *t)) {
      ++it;
      continue;
    }
    std::ostringstream key;
    key << t->dtype() << t->device() << t->sizes() << t->strides();
    auto& same_shape = first[key.str()];
    Value* pooled = nullptr;
    for (const auto& [u, read] : same_shape) {
      if (u.is_same(*t) || u.equal(*t)) {
        pooled = read;
        break;
      }
    }
    if (pooled == nullptr) {
      same_shape.emplace_back(*t, n->output());
      ++it;
      continue;
    }
    n->output()->replaceAllUsesWith(pooled);
    // destroyCurrent steps back to the node before: step on past it, or a read just pooled into
    // (the node before, when two equal buffers are read back to back) would be met again and
    // pooled into itself, which never ends.
    it.destroyCurrent();
    ++it;
  }
}

// The module attribute `v` reads (a chain of prim::GetAttr from the module, graph input 0) and the
// path that names it (`mlp_gate_proj_weight`); `what` says what the caller would do with it.
std::pair<at::Tensor, std::string> module_attribute(torch::jit::Module& m, Graph& g, Value* v, const std::string& what) {
  if (v == g.inputs()[0]) throw std::runtime_error("the module itself cannot be " + what);
  const auto path = attribute_path(g, v);
  if (!path) throw std::runtime_error("value " + v->debugName() + " is no module attribute: it cannot be " + what);
  const auto a = find_attribute(m, *path);
  if (!a) throw std::runtime_error("value " + v->debugName() + " is no module attribute");
  if (!a->value.isTensor() || !a->value.toTensor().defined() || a->value.toTensor().dim() < 1) {
    throw std::runtime_error("attribute " + a->name + " is no tensor: it cannot be " + what);
  }
  return {a->value.toTensor().detach(), a->name};
}

// `t` as a buffer of the module named `base` (a number added where the name is taken by anything
// else), read by a new prim::GetAttr at the insert point: the same tensor under the same name is
// one buffer, whatever reads it.
Value* module_buffer(torch::jit::Module& m, Graph& g, const std::string& base, const at::Tensor& t) {
  std::string name = base;
  for (int i = 1; m.hasattr(name); ++i) {
    const c10::IValue have = m.attr(name);
    if (have.isTensor() && have.toTensor().dtype() == t.dtype() && have.toTensor().sizes() == t.sizes() &&
        have.toTensor().equal(t)) {
      return g.insertGetAttr(g.inputs()[0], name);
    }
    name = base + "_" + std::to_string(i);
  }
  m.register_buffer(name, t);
  return g.insertGetAttr(g.inputs()[0], name);
}

// A module attribute padded with zeros along its first dim to `rows` rows, as a buffer of the
// module (`fact_padded_<path>_<rows>`, made once whatever reads it; the attribute itself stays for
// the fallback and its other readers).
Value* padded_attribute(torch::jit::Module& m, Graph& g, Value* v, int64_t rows) {
  auto [t, path] = module_attribute(m, g, v, "padded");
  if (t.size(0) > rows) {
    throw std::runtime_error("attribute " + path + " is no tensor of at most " + std::to_string(rows) +
                             " rows: it cannot be padded to them");
  }
  std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
  shape[0] = rows;
  at::Tensor padded = at::zeros(shape, t.options());
  padded.narrow(0, 0, t.size(0)).copy_(t);
  return module_buffer(m, g, "fact_padded_" + path + "_" + std::to_string(rows), padded);
}

// Two module attributes of one shape [R, ...] interleaved along their first dim in blocks of
// `block` rows (block 0 of the first, block 0 of the second, block 1 of the first, ...: [2R, ...]),
// as a buffer of the module (`fact_interleaved_<first>_<second>`, made once; the attributes stay
// for the fallback and their other readers): the gated MLP's one weight over gate and up.
Value* interleaved_attributes(torch::jit::Module& m, Graph& g, Value* first, Value* second, int64_t block) {
  at::Tensor a, b;
  std::string pa, pb;
  if (second != nullptr) {
    std::tie(a, pa) = module_attribute(m, g, first, "interleaved");
    std::tie(b, pb) = module_attribute(m, g, second, "interleaved");
  } else {
    // One attribute: its first and second halves (a fused gate-and-up weight).
    at::Tensor whole;
    std::tie(whole, pa) = module_attribute(m, g, first, "interleaved");
    if (whole.dim() < 1 || whole.size(0) % 2 != 0) {
      throw std::runtime_error("attribute " + pa + " has no two halves along its first dim: they cannot be interleaved");
    }
    const int64_t half = whole.size(0) / 2;
    a = whole.narrow(0, 0, half);
    b = whole.narrow(0, half, half);
    pb = "halves";
  }
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype() || block < 1 || a.size(0) % block != 0) {
    throw std::runtime_error("attributes " + pa + " and " + pb + " are not two tensors of one shape and dtype in blocks of " +
                             std::to_string(block) + " rows: they cannot be interleaved");
  }
  std::vector<int64_t> blocks{a.size(0) / block, 1, block};
  blocks.insert(blocks.end(), a.sizes().begin() + 1, a.sizes().end());
  std::vector<int64_t> shape(a.sizes().begin(), a.sizes().end());
  shape[0] = 2 * a.size(0);
  const at::Tensor t = at::cat({a.reshape(blocks), b.reshape(blocks)}, 1).reshape(shape).contiguous();
  return module_buffer(m, g, "fact_interleaved_" + pa + "_" + pb, t);
}

// Module attributes of one dtype and one shape past their first dim, concatenated along their first
// dim, as a buffer of the module (`fact_concatenated_<first>_<second>..`, made once; the attributes
// stay for their other readers): sibling linears' weights (or biases) as one GEMM's.
Value* concatenated_attributes(torch::jit::Module& m, Graph& g, const std::vector<Value*>& values) {
  if (values.size() < 2) throw std::runtime_error("a concatenated operand names two attributes or more");
  std::vector<at::Tensor> parts;
  std::string name = "fact_concatenated";
  for (Value* v : values) {
    auto [t, path] = module_attribute(m, g, v, "concatenated");
    if (!parts.empty() && (t.dtype() != parts[0].dtype() || t.dim() != parts[0].dim() ||
                           !std::equal(t.sizes().begin() + 1, t.sizes().end(), parts[0].sizes().begin() + 1))) {
      throw std::runtime_error("attribute " + path + " differs from the first in dtype or in its shape past the first dim: they cannot be concatenated");
    }
    parts.push_back(t);
    name += "_" + path;
  }
  return module_buffer(m, g, name, at::cat(parts, 0).contiguous());
}

// A convolution's bias (`channels` 0) or weight (`channels` input channels) with an eval-mode BatchNorm
// folded in, from the module attributes `values` reads ([weight, bias, gamma, beta, mean, var], kAbsent
// where there is none; `eps` empty without a BatchNorm), as a buffer of the module
// (`fact_folded_<weight path>[_c<channels>]` or `..._bias`, made once; the attributes stay for the
// fallback and their other readers). Computed in fp64 and rounded to the weight's dtype:
// w' = w * gamma / sqrt(var + eps), its input channels past the weight's own zero (a stem's 3 padded to
// 16-byte rows: zero channels of x meet them, so the convolution is the same), laid out channels-last
// (KRSC, the kernels' layout), and b' = (b - mean) * gamma / sqrt(var + eps) + beta.
Value* folded_attributes(torch::jit::Module& m, Graph& g, const rust::Vec<uint32_t>& values, const std::string& eps_text,
                         int64_t channels, const std::function<Value*(uint32_t)>& value_at) {
  constexpr uint32_t kAbsent = UINT32_MAX;
  if (values.size() != 6 || values[0] == kAbsent || channels < 0) {
    throw std::runtime_error("internal: a folded operand names a weight, five optional attributes and its part");
  }
  auto [w, path] = module_attribute(m, g, value_at(values[0]), "folded");
  if (w.dim() != 4 || !w.is_floating_point()) {
    throw std::runtime_error("attribute " + path + " is no 4-D convolution weight: it cannot be folded");
  }
  if (channels != 0 && channels < w.size(1)) {
    throw std::runtime_error("attribute " + path + " has " + std::to_string(w.size(1)) + " input channels: it cannot be padded to " +
                             std::to_string(channels));
  }
  const int64_t k = w.size(0);
  auto channel = [&](uint32_t id, double none) {
    if (id == kAbsent) return at::full({k}, none, at::kDouble);
    auto [t, p] = module_attribute(m, g, value_at(id), "folded");
    if (t.dim() != 1 || t.size(0) != k) {
      throw std::runtime_error("attribute " + p + " is no vector of " + std::to_string(k) + " channels: it cannot be folded into " + path);
    }
    return t.to(at::kDouble);
  };
  at::Tensor scale = at::ones({k}, at::kDouble), shift = at::zeros({k}, at::kDouble);
  if (!eps_text.empty()) {
    if (values[4] == kAbsent || values[5] == kAbsent) throw std::runtime_error("a folded BatchNorm needs its running mean and variance");
    char* end = nullptr;
    const double eps = std::strtod(eps_text.c_str(), &end);
    if (end != eps_text.c_str() + eps_text.size()) throw std::runtime_error("a folded BatchNorm's eps '" + eps_text + "' is no number");
    scale = channel(values[2], 1.0) / at::sqrt(channel(values[5], 0.0) + eps);
    shift = channel(values[3], 0.0) - channel(values[4], 0.0) * scale;
  }
  if (channels != 0) {
    const at::Tensor scaled = (w.to(at::kDouble) * scale.view({k, 1, 1, 1})).to(w.scalar_type());
    // at::zeros drops a memory format its options carry; at::empty keeps it.
    at::Tensor folded = at::empty({k, channels, w.size(2), w.size(3)}, scaled.options().memory_format(at::MemoryFormat::ChannelsLast));
    folded.zero_();
    folded.narrow(1, 0, w.size(1)).copy_(scaled);
    const std::string padded = channels == w.size(1) ? "" : "_c" + std::to_string(channels);
    return module_buffer(m, g, "fact_folded_" + path + padded, folded);
  }
  const at::Tensor folded = (channel(values[1], 0.0) * scale + shift).to(w.scalar_type());
  return module_buffer(m, g, "fact_folded_" + path + "_bias", folded);
}

// Seconds since `t`, to a tenth.
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::round(std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count() * 10) / 10;
}

// A call an edit made and the names of the values it took over, in its outputs' order.
struct Replaced {
  Node* call;
  std::vector<std::string> names;
};

// Makes `edits` in the normalised forward graph `g` of module `m` (which gains the buffers the
// operands prepare): each pattern replaced by one call of its op. Ids refer to the graph as
// load_graph numbered it. Returns the calls made, in the edits' order.
std::vector<Replaced> apply_edits(torch::jit::Module& m, const std::shared_ptr<Graph>& g, const rust::Vec<Edit>& edits) {
  std::vector<Replaced> replaced_calls;
  // One numbering for all edits: ids refer to the graph as load_graph saw it. Destroyed nodes
  // are remembered by id (their memory may be reused by new nodes), so that no later edit
  // touches their dangling pointers.
  Numbering num(*g);
  std::vector<bool> destroyed(num.nodes.size(), false);
  auto value_at = [&](uint32_t id) {
    if (id >= num.values.size()) throw std::runtime_error("edit names value " + std::to_string(id) + " beyond the graph");
    if (num.owner[id] >= 0 && destroyed[num.owner[id]]) {
      throw std::runtime_error("value " + std::to_string(id) + " belongs to a node an earlier edit removed");
    }
    return num.values[id];
  };
  for (const Edit& e : edits) {
    Node* old = expect_node(num, destroyed, e.node, std::string(e.expect_kind));
    if (e.remove.size() != e.remove_kinds.size()) {
      throw std::runtime_error("edit of node " + std::to_string(e.node) + " names " + std::to_string(e.remove.size()) +
                               " nodes to remove but " + std::to_string(e.remove_kinds.size()) + " kinds");
    }
    // The pattern's other nodes, latest first: a node's users inside the pattern come after it,
    // so destroying in reverse program order leaves each one without uses when its turn comes.
    std::vector<std::pair<uint32_t, Node*>> remove;
    for (size_t i = 0; i < e.remove.size(); ++i) {
      if (e.remove[i] == e.node) throw std::runtime_error("edit of node " + std::to_string(e.node) + " also removes it");
      remove.emplace_back(e.remove[i], expect_node(num, destroyed, e.remove[i], std::string(e.remove_kinds[i])));
    }
    std::sort(remove.begin(), remove.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
    if (std::adjacent_find(remove.begin(), remove.end(), [](const auto& x, const auto& y) {
          return x.first == y.first;
        }) != remove.end()) {
      throw std::runtime_error("edit of node " + std::to_string(e.node) + " removes a node twice");
    }
    // The nodes whose outputs the call takes over: `old`'s first, then the further ones; the
    // call goes before the latest of them.
    if (e.outputs.size() != e.output_kinds.size()) {
      throw std::runtime_error("edit of node " + std::to_string(e.node) + " names " + std::to_string(e.outputs.size()) +
                               " further outputs but " + std::to_string(e.output_kinds.size()) + " kinds");
    }
    std::vector<std::pair<uint32_t, Node*>> outs = {{e.node, old}};
    for (size_t i = 0; i < e.outputs.size(); ++i) {
      const uint32_t id = e.outputs[i];
      const bool taken = std::any_of(outs.begin(), outs.end(), [&](const auto& o) { return o.first == id; }) ||
                         std::any_of(remove.begin(), remove.end(), [&](const auto& r) { return r.first == id; });
      if (taken) throw std::runtime_error("edit of node " + std::to_string(e.node) + " names node " + std::to_string(id) + " twice");
      outs.emplace_back(id, expect_node(num, destroyed, id, std::string(e.output_kinds[i])));
    }
    Node* at = old;
    for (const auto& [id, n] : outs) {
      if (n->outputs().size() != 1) throw std::runtime_error(node_label(id, n) + " has " + std::to_string(n->outputs().size()) + " outputs: a call takes over one per node");
      if (e.first ? n->isBefore(at) : n->isAfter(at)) at = n;
    }
    if (e.first) {
      // Every operand the graph already holds must exist where the call goes.
      for (const Operand& o : e.operands) {
        if (o.kind != OperandKind::Value) continue;
        Node* p = value_at(o.value)->node();
        if (p->owningGraph() == g.get() && p->kind() != c10::prim::Param && !p->isBefore(at)) {
          throw std::runtime_error("edit of node " + std::to_string(e.node) + " reads value " + std::to_string(o.value) +
                                   ", defined after the first node it replaces");
        }
      }
    }
    auto replaced = [&](const Node* n) {
      return std::any_of(outs.begin(), outs.end(), [&](const auto& o) { return o.second == n; }) ||
             std::any_of(remove.begin(), remove.end(), [&](const auto& r) { return r.second == n; });
    };
    for (const auto& [id, n] : outs) {
      if (outs.size() == 1) break;
      for (const torch::jit::Use& u : n->output()->uses()) {
        if (!replaced(u.user) && !u.user->isAfter(at)) {
          throw std::runtime_error(node_label(id, n) + " is read (by " + u.user->kind().toQualString() +
                                   ") before the call can be made, where its last output is");
        }
      }
    }

    // The call and what it needs (constants, lists) go right before the pattern's last node;
    // the insert point is restored before that node is destroyed.
    std::vector<Value*> args;
    Node* call = nullptr;
    {
      torch::jit::WithInsertPoint guard(at);
      for (const Operand& o : e.operands) {
        switch (o.kind) {
          case OperandKind::Value: args.push_back(value_at(o.value)); break;
          case OperandKind::Str: args.push_back(g->insertConstant(std::string(o.text))); break;
          case OperandKind::Int: args.push_back(g->insertConstant(o.int_value)); break;
          case OperandKind::None: args.push_back(g->insertConstant(c10::IValue())); break;
          case OperandKind::Padded: args.push_back(padded_attribute(m, *g, value_at(o.value), o.int_value)); break;
          case OperandKind::Interleaved: {
            if (o.values.size() != 1 && o.values.size() != 2) {
              throw std::runtime_error("an interleaved operand names one attribute (its halves) or two");
            }
            args.push_back(interleaved_attributes(m, *g, value_at(o.values[0]),
                                                  o.values.size() == 2 ? value_at(o.values[1]) : nullptr, o.int_value));
            break;
          }
          case OperandKind::Folded:
            args.push_back(folded_attributes(m, *g, o.values, std::string(o.text), o.int_value, value_at));
            break;
          case OperandKind::Concatenated: {
            std::vector<Value*> attrs;
            for (uint32_t v : o.values) attrs.push_back(value_at(v));
            args.push_back(concatenated_attributes(m, *g, attrs));
            break;
          }
          case OperandKind::Values: {
            std::vector<Value*> elems;
            for (uint32_t v : o.values) elems.push_back(value_at(v));
            args.push_back(g->insertNode(g->createList(c10::TensorType::get(), elems))->output());
            break;
          }
          default: throw std::runtime_error("internal: unknown operand kind");
        }
      }
      call = g->create(c10::Symbol::fromQualString(std::string(e.op)), args, outs.size());
      call->insertBefore(at);
    }
    call->copyMetadata(old);
    Replaced r{call, {}};
    for (const auto& o : outs) r.names.push_back(o.second->output()->debugName());
    replaced_calls.push_back(std::move(r));
    for (size_t i = 0; i < outs.size(); ++i) {
      Value* was = outs[i].second->output();
      call->outputs()[i]->setType(was->type());
      was->replaceAllUsesWith(call->outputs()[i]);
      // The pattern's outputs keep their ids: a later edit may read them (one pattern's result
      // is the next one's residual), and now gets the call's outputs.
      const uint32_t out_id = num.id.at(was);
      num.values[out_id] = call->outputs()[i];
      num.owner[out_id] = -1;
    }

    // Dead-code elimination would run alias analysis, which needs fact's ops registered in this
    // process; only the constants the destroyed nodes alone used can have died, so remove those.
    std::vector<Value*> former;
    auto destroy = [&](uint32_t id, Node* n) {
      for (Value* out : n->outputs()) {
        if (!out->uses().empty()) {
          throw std::runtime_error(node_label(id, n) + " is still used after the rewrite (by " +
                                   out->uses()[0].user->kind().toQualString() +
                                   "): its output must not leave the replaced pattern");
        }
      }
      // Inputs produced inside the pattern are destroyed with it; keep only the others.
      for (Value* v : n->inputs()) {
        if (!replaced(v->node())) former.push_back(v);
      }
      destroyed[id] = true;
      n->destroy();
    };
    for (const auto& [id, n] : outs) destroy(id, n);
    for (const auto& [id, n] : remove) destroy(id, n);
    // A constant may feed several destroyed nodes (or one twice): destroy each once.
    std::unordered_set<Node*> dead;
    for (Value* v : former) {
      if (v->node()->kind() == c10::prim::Constant && v->uses().empty()) dead.insert(v->node());
    }
    for (Node* n : dead) {
      auto it = num.node_id.find(n);
      if (it != num.node_id.end()) destroyed[it->second] = true;
      n->destroy();
    }
  }
  return replaced_calls;
}

rust::String rewrite_and_save(rust::Str path, rust::Str out_path, const rust::Vec<Edit>& edits,
                              const rust::Vec<rust::String>& schemas) {
  return guarded("cannot rewrite the TorchScript graph", [&] {
    const auto start = std::chrono::steady_clock::now();
    ensure_schemas(schemas);
    auto m = load_module(to_std(path));
    const double load_s = seconds_since(start);
    const auto edits_start = std::chrono::steady_clock::now();
    auto& fn = torch::jit::toGraphFunction(m.get_method("forward").function());
    // Rewrite the method's own graph in place so that saving prints the new code.
    std::shared_ptr<Graph> g = fn.graph();
    normalise(*g);
    apply_edits(m, g, edits);
    // One progress line: what each pass took (a real model's archive is a gigabyte or more).
    std::ostringstream took;
    took << "rewrite: load " << load_s << " s, " << edits.size() << " edits " << seconds_since(edits_start) << " s";
    auto step = [&](const char* name, auto&& pass) {
      const auto t = std::chrono::steady_clock::now();
      pass();
      took << ", " << name << " " << seconds_since(t) << " s";
    };
    step("sizes", [&] { sizes_before_casts(*g); });
    step("host shapes", [&] { host_shape_arithmetic(*g); });
    step("pooling", [&] { pool_equal_buffers(m, *g); });
    step("memo", [&] { memoize_static_values(m, g); });
    step("saving", [&] { save_whole(m, to_std(out_path)); });
    std::cerr << took.str() << std::endl;
    return rust::String(g->toString());
  });
}

// A buffer the writer adds: placeholder `name`, attribute `attr`, the bytes of `value`.
WrittenBuffer written_buffer(const std::string& name, const std::string& attr, const at::Tensor& value) {
  const at::Tensor t = value.contiguous().cpu();
  WrittenBuffer b;
  b.name = name;
  b.attr = attr;
  b.dtype = dtype_name(t.scalar_type());
  for (auto d : t.sizes()) b.sizes.push_back(d);
  const auto* bytes = static_cast<const uint8_t*>(t.data_ptr());
  const size_t nbytes = t.numel() * t.element_size();
  b.data.reserve(nbytes);
  for (size_t i = 0; i < nbytes; ++i) b.data.push_back(bytes[i]);
  return b;
}

// The most bytes a folded value takes (`fold_static_values`): a larger one stays in the forward.
constexpr int64_t kMaxFoldBytes = 64 << 20;

// The name a rewritten program gives value `v`: the program's own name, the name a call took
// over (`renamed`), or, for an attribute the rewrite added, its placeholder's (`b_<attribute>`,
// its bytes added to `buffers` once).
std::string written_name(torch::jit::Module& m, const std::string& path, Value* v,
                         const std::unordered_map<const Value*, std::string>& renamed,
                         std::unordered_map<std::string, std::string>& added, rust::Vec<WrittenBuffer>& buffers) {
  auto it = renamed.find(v);
  if (it != renamed.end()) return it->second;
  Node* n = v->node();
  if (n->kind() == c10::prim::GetAttr && n->input()->node()->kind() == c10::prim::Param) {
    const std::string attr = n->s(c10::attr::name);
    const std::string own = export_placeholder(path, attr);
    if (!own.empty()) return own;
    auto a = added.find(attr);
    if (a != added.end()) return a->second;
    added[attr] = "b_" + attr;
    buffers.push_back(written_buffer(added[attr], attr, m.attr(attr).toTensor()));
    return added[attr];
  }
  if (!program_named(v)) {
    throw std::runtime_error("a call reads a value the program does not name (made by " +
                             std::string(n->kind().toQualString()) + ")");
  }
  return v->debugName();
}

ExportRewrite rewrite_export(rust::Str path, const rust::Vec<Edit>& edits, const rust::Vec<rust::String>& schemas) {
  return guarded("cannot rewrite the exported program", [&] {
    ensure_schemas(schemas);
    const std::string p = to_std(path);
    if (!is_export(p)) throw std::runtime_error(p + " is no .pt2 archive read in this process");
    auto m = load_module(p);
    auto& fn = torch::jit::toGraphFunction(m.get_method("forward").function());
    std::shared_ptr<Graph> g = fn.graph();
    normalise(*g);
    const std::vector<Replaced> calls = apply_edits(m, g, edits);
    std::unordered_map<const Node*, const Replaced*> by_call;
    std::unordered_map<const Value*, std::string> renamed;
    for (const Replaced& r : calls) {
      by_call[r.call] = &r;
      for (size_t i = 0; i < r.names.size(); ++i) renamed[r.call->outputs()[i]] = r.names[i];
    }
    std::unordered_map<std::string, std::string> added;
    ExportRewrite out;
    // A program has no memo: what its forward computes from its state alone (BEiT's relative
    // position bias, from a CPU index into its table) is computed here once and kept as a buffer
    // named as the value was, so the nodes the program keeps read it unchanged.
    for (const Folded& f : fold_static_values(m, g, kMaxFoldBytes)) {
      out.buffers.push_back(written_buffer(f.name, f.attr, f.value));
      added[f.attr] = f.name;
    }
    auto program_name = [](const Value* v) { return program_named(v) ? v->debugName() : std::string(); };
    for (Node* n : g->nodes()) {
      const auto kind = n->kind();
      if (kind == c10::prim::Constant || kind == c10::prim::ListConstruct || kind == c10::prim::GetAttr ||
          kind == c10::prim::ListUnpack || kind == c10::prim::TupleConstruct) {
        continue;
      }
      auto call = by_call.find(n);
      if (call == by_call.end()) {
        // The program's own node: named by one of its outputs (a list's by its elements').
        std::string name;
        for (Value* o : n->outputs()) {
          if (name.empty()) name = program_name(o);
          for (const torch::jit::Use& u : o->uses()) {
            if (name.empty() && u.user->kind() == c10::prim::ListUnpack) {
              for (Value* e : u.user->outputs()) {
                if (name.empty()) name = program_name(e);
              }
            }
          }
        }
        if (name.empty()) {
          throw std::runtime_error("the rewritten graph holds a " + std::string(kind.toQualString()) +
                                   " node the program does not have: it cannot be written as .pt2");
        }
        WrittenNode w;
        w.original = name;
        out.nodes.push_back(std::move(w));
        continue;
      }
      const c10::FunctionSchema& schema = n->schema();
      WrittenNode w;
      w.op = kind.toQualString();
      for (const auto& name : call->second->names) w.outputs.push_back(name);
      for (size_t i = 0; i < n->inputs().size(); ++i) {
        Value* v = n->input(i);
        WrittenArg a;
        a.name = schema.arguments().at(i).name();
        a.number = 0;
        Node* src = v->node();
        if (src->kind() == c10::prim::Constant) {
          const c10::IValue iv = *torch::jit::toIValue(v);
          if (iv.isNone()) {
            a.kind = "as_none";
          } else if (iv.isInt()) {
            a.kind = "as_int";
            a.ints.push_back(iv.toInt());
          } else if (iv.isDouble()) {
            a.kind = "as_float";
            a.number = iv.toDouble();
          } else if (iv.isBool()) {
            a.kind = "as_bool";
            a.ints.push_back(iv.toBool());
          } else if (iv.isString()) {
            a.kind = "as_string";
            a.text = iv.toStringRef();
          } else if (iv.isIntList()) {
            a.kind = "as_ints";
            for (int64_t x : iv.toIntVector()) a.ints.push_back(x);
          } else if (iv.isTensor() && !program_name(v).empty()) {
            // A tensor constant of the program, read by its placeholder.
            a.kind = "as_tensor";
            a.names.push_back(program_name(v));
          } else {
            throw std::runtime_error(std::string(w.op) + " takes a constant " + iv.tagKind() + " the writer does not write");
          }
        } else if (src->kind() == c10::prim::ListConstruct) {
          a.kind = "as_tensors";
          for (Value* e : src->inputs()) a.names.push_back(written_name(m, p, e, renamed, added, out.buffers));
        } else {
          a.kind = "as_tensor";
          a.names.push_back(written_name(m, p, v, renamed, added, out.buffers));
        }
        w.args.push_back(std::move(a));
      }
      out.nodes.push_back(std::move(w));
    }
    return out;
  });
}

void write_archive(rust::Str source, rust::Str out_path, const rust::Vec<rust::String>& skip,
                   const rust::Vec<ArchiveRecord>& add) {
  guarded("cannot write the archive", [&] {
    caffe2::serialize::PyTorchStreamReader reader(to_std(source));
    FileSink sink(to_std(out_path));
    {
      // Written through a function, the archive's top folder is "archive" whatever the file's
      // name (torch reads any).
      caffe2::serialize::PyTorchStreamWriter writer(sink.writer());
      std::unordered_set<std::string> skipped;
      for (const auto& s : skip) skipped.insert(std::string(s));
      // The writer adds its own version, byte order and serialization id.
      for (const char* own : {".data/version", "byteorder", ".data/serialization_id", "version"}) skipped.insert(own);
      for (const std::string& name : reader.getAllRecords()) {
        if (skipped.count(name)) continue;
        auto [data, size] = reader.getRecord(name);
        writer.writeRecord(name, data.get(), size);
      }
      for (const ArchiveRecord& r : add) writer.writeRecord(std::string(r.name), r.data.data(), r.data.size());
      writer.writeEndOfFile();
    }
    sink.finish();
    return 0;
  });
}

void save_module(rust::Str path, rust::Str out_path) {
  guarded("cannot save the TorchScript module", [&] {
    auto m = load_module(to_std(path));
    save_whole(m, to_std(out_path));
    return 0;
  });
}

rust::Vec<rust::String> archive_records(rust::Str path) {
  return guarded("cannot read the zip archive", [&] {
    caffe2::serialize::PyTorchStreamReader reader(to_std(path));
    rust::Vec<rust::String> out;
    for (const auto& r : reader.getAllRecords()) out.push_back(rust::String(r));
    return out;
  });
}

rust::Vec<uint8_t> archive_record(rust::Str path, rust::Str name, size_t limit) {
  return guarded("cannot read the zip archive", [&] {
    caffe2::serialize::PyTorchStreamReader reader(to_std(path));
    auto [data, size] = reader.getRecord(to_std(name));
    rust::Vec<uint8_t> out;
    const auto* bytes = static_cast<const uint8_t*>(data.get());
    for (size_t i = 0; i < std::min(size, limit); ++i) out.push_back(bytes[i]);
    return out;
  });
}

rust::String graph_text(rust::Str path) {
  return guarded("cannot load the TorchScript graph", [&] {
    auto m = load_module(to_std(path));
    return rust::String(inlined_forward(m)->toString());
  });
}

// Whether argument `arg` of a schema takes a dtype (`ScalarType` or `ScalarType?`).
bool takes_dtype(const c10::Argument& arg) {
  c10::TypePtr t = arg.real_type();
  if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
  return t->kind() == c10::TypeKind::ScalarTypeType;
}

// Every floating dtype the graph's ops are given as a constant, and every floating tensor
// constant, in fp64. A trace bakes `x.to(weight.dtype)` as a cast to the dtype it ran in (DINOv2
// casts its pixels so before the patch convolution; decoders their norms' output): kept, the
// reference would round there and hand fp64 weights a bf16 operand, which convolution and linear
// refuse.
void doubled_float_constants(torch::jit::Block* b) {
  auto g = b->owningGraph();
  for (Node* n : b->nodes()) {
    for (torch::jit::Block* sub : n->blocks()) doubled_float_constants(sub);
    if (n->kind() == c10::prim::Constant && n->output()->type()->cast<c10::TensorType>()) {
      const at::Tensor t = torch::jit::toIValue(n->output())->toTensor();
      if (!t.is_floating_point() || t.scalar_type() == at::kDouble) continue;
      torch::jit::WithInsertPoint guard(n);
      n->output()->replaceAllUsesWith(g->insertConstant(t.to(at::kDouble)));
      continue;
    }
    const c10::FunctionSchema* schema = n->maybeSchema();
    if (schema == nullptr) continue;
    for (size_t i = 0; i < n->inputs().size() && i < schema->arguments().size(); ++i) {
      if (!takes_dtype(schema->arguments()[i])) continue;
      const auto iv = torch::jit::toIValue(n->input(i));
      if (!iv || !iv->isInt()) continue;
      const auto dtype = static_cast<at::ScalarType>(iv->toInt());
      if (!at::isFloatingType(dtype) || dtype == at::kDouble) continue;
      torch::jit::WithInsertPoint guard(n);
      n->replaceInput(i, g->insertConstant(static_cast<int64_t>(at::kDouble)));
    }
  }
}

void save_fp64_copy(rust::Str path, rust::Str out_path) {
  guarded("cannot make the fp64 copy", [&] {
    auto m = load_module(to_std(path));
    // Each module type's methods once (instances of one type share them).
    std::unordered_set<const torch::jit::Graph*> seen;
    for (const auto& sub : m.modules()) {
      for (const auto& method : sub.get_methods()) {
        const std::shared_ptr<torch::jit::Graph> g = method.graph();
        if (seen.insert(g.get()).second) doubled_float_constants(g->block());
      }
    }
    // Only floating state becomes fp64: Module::to(kDouble) would also turn a bool causal mask
    // into doubles, which bitwise_not and masked_fill refuse.
    for (const auto& p : m.named_parameters(/*recurse=*/true)) {
      if (p.value.is_floating_point()) p.value.set_data(p.value.to(at::kDouble));
    }
    for (const auto& b : m.named_buffers(/*recurse=*/true)) {
      if (b.value.is_floating_point()) b.value.set_data(b.value.to(at::kDouble));
    }
    save_whole(m, to_std(out_path));
    return 0;
  });
}

void set_float32_matmul_precision(rust::Str mode) {
  guarded("cannot set the matmul precision", [&] {
    at::globalContext().setFloat32MatmulPrecision(to_std(mode));
    return 0;
  });
}

rust::String float32_matmul_precision() {
  switch (at::globalContext().float32MatmulPrecision()) {
    case at::Float32MatmulPrecision::HIGHEST: return "highest";
    case at::Float32MatmulPrecision::HIGH: return "high";
    case at::Float32MatmulPrecision::MEDIUM: return "medium";
  }
  return "unknown";
}

}  // namespace fact::bridge

namespace fact::bridge {
rust::String torch_version() { return rust::String(TORCH_VERSION); }
}  // namespace fact::bridge
