// The torch.export front end's C++ half (see src/torch/export/mod.rs): builds a TorchScript module
// from a program the Rust side read from a .pt2 archive, so the bridge's passes (numbering, shape
// capture, mask classification, the memo's facts, the rewrite) read it as they read a traced
// archive. Each node becomes the TorchScript node of its op's schema, every argument filled (from
// the program, else the schema's default); values keep the program's names, which the .pt2 writer
// reads back; parameters, buffers and constants become attributes of the module read by
// prim::GetAttr, as in traced modules. Built anew on every load (the bridge edits the graph it
// gets), from the program and weights kept per archive path.
#include "fact/src/torch/export.h"
#include "fact/src/torch/bridge.h"
#include "fact/src/torch/mod.rs.h"

#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/runtime/custom_operator.h>
#include <torch/csrc/jit/runtime/operator.h>
#include <torch/script.h>
#include <torch/serialize.h>
#include <caffe2/serialize/inline_container.h>

#include <mutex>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

namespace fact::bridge {
namespace {

using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

struct Arg {
  std::string name;
  ExportArgKind kind;
  std::vector<std::string> names;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<bool> bools;
  std::string text;
};

struct Meta {
  at::ScalarType dtype;
  std::vector<int64_t> sizes, strides;
};

struct OpNode {
  std::string op, overload;
  std::vector<Arg> args;
  std::vector<std::string> outputs;
  bool list_output;
  std::string scope;
  bool custom;              // another library's op (graph::is_custom_op)
  std::vector<Meta> metas;  // a custom op's outputs at the sample (empty where unknown)
};

struct Program {
  std::vector<std::pair<std::string, std::string>> state;  // (placeholder name, attribute name)
  std::vector<bool> parameter;
  // Tensor constants of at most one element: constants of the graph, not attributes.
  std::vector<bool> inline_constant;
  std::vector<std::string> inputs, outputs;
  std::vector<std::vector<int64_t>> sample;  // the inputs' sizes at the sample (empty: unknown)
  std::vector<OpNode> nodes;
  std::unordered_map<std::string, at::Tensor> tensors;  // by attribute name
  std::vector<at::Tensor> samples;
};

std::mutex programs_mutex;
std::unordered_map<std::string, std::shared_ptr<const Program>> programs;

std::string to_std(rust::Str s) { return std::string(s.data(), s.size()); }

at::ScalarType dtype_of(const std::string& s) {
  static const std::unordered_map<std::string, at::ScalarType> by_name = {
      {"f32", at::kFloat}, {"f64", at::kDouble}, {"f16", at::kHalf}, {"bf16", at::kBFloat16},
      {"i64", at::kLong},  {"i32", at::kInt},    {"i16", at::kShort}, {"i8", at::kChar},
      {"u8", at::kByte},   {"bool", at::kBool}};
  auto it = by_name.find(s);
  if (it == by_name.end()) throw std::runtime_error("dtype " + s + " is not one fact reads");
  return it->second;
}

// An attribute name TorchScript takes: the fully qualified name with its dots as underscores,
// made unique.
std::string attribute_name(const std::string& fqn, std::unordered_map<std::string, int>& taken) {
  std::string s;
  for (char c : fqn) s += (std::isalnum(static_cast<unsigned char>(c)) || c == '_') ? c : '_';
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) s = "_" + s;
  int& n = taken[s];
  return n++ == 0 ? s : s + "_" + std::to_string(n);
}

// A tensor from the raw bytes of an archive record, laid out as its metadata says.
at::Tensor payload(caffe2::serialize::PyTorchStreamReader& reader, const ExportState& s) {
  auto [data, size] = reader.getRecord(to_std(s.record));
  const at::ScalarType dt = dtype_of(std::string(s.dtype));
  const int64_t elems = static_cast<int64_t>(size) / static_cast<int64_t>(c10::elementSize(dt));
  at::Tensor flat = at::empty({elems}, at::TensorOptions().dtype(dt));
  std::memcpy(flat.data_ptr(), data.get(), static_cast<size_t>(elems) * c10::elementSize(dt));
  std::vector<int64_t> sizes(s.sizes.begin(), s.sizes.end()), strides(s.strides.begin(), s.strides.end());
  int64_t needed = s.offset + 1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) needed = 0;
    if (needed > 0) needed += (sizes[i] - 1) * strides[i];
  }
  if (needed > elems) {
    throw std::runtime_error(std::string(s.record) + " holds " + std::to_string(elems) + " elements, its tensor needs " +
                             std::to_string(needed) + ": the archive is damaged; save the program again");
  }
  return flat.as_strided(sizes, strides, s.offset);
}

// The sample inputs torch.export.save stores (data/sample_inputs/model.pt, a torch.save of
// (args, kwargs)); empty where there are none or they are not plain tensors.
std::vector<at::Tensor> sample_inputs(caffe2::serialize::PyTorchStreamReader& reader) {
  std::vector<at::Tensor> out;
  const std::string name = "data/sample_inputs/model.pt";
  if (!reader.hasRecord(name)) return out;
  try {
    auto [data, size] = reader.getRecord(name);
    std::vector<char> bytes(static_cast<const char*>(data.get()), static_cast<const char*>(data.get()) + size);
    c10::IValue all = torch::pickle_load(bytes);
    if (!all.isTuple() || all.toTupleRef().elements().empty()) return {};
    const c10::IValue& args = all.toTupleRef().elements()[0];
    const auto elems = args.isTuple() ? args.toTupleRef().elements().vec()
                                      : (args.isList() ? args.toListRef().vec() : std::vector<c10::IValue>{});
    for (const c10::IValue& v : elems) {
      if (!v.isTensor()) return {};
      out.push_back(v.toTensor().to(at::kCPU));
    }
  } catch (const std::exception&) {
    return {};
  }
  return out;
}

// The operator `op` with overload `overload` ("" for the default one), JIT-registered or not;
// null where this libtorch has none.
std::shared_ptr<torch::jit::Operator> maybe_operator(const std::string& op, const std::string& overload) {
  for (const auto& o : torch::jit::getAllOperatorsFor(c10::Symbol::fromQualString(op))) {
    if (o->schema().overload_name() == overload) return o;
  }
  return nullptr;
}

// The schema type of an argument as the program passes it.
const char* schema_type(ExportArgKind k) {
  switch (k) {
    case ExportArgKind::None: return "Tensor?";
    case ExportArgKind::Tensor: return "Tensor";
    case ExportArgKind::Tensors: return "Tensor[]";
    case ExportArgKind::OptionalTensors: return "Tensor?[]";
    case ExportArgKind::Int: return "int";
    case ExportArgKind::Ints: return "int[]";
    case ExportArgKind::SymInt: return "SymInt";
    case ExportArgKind::Float: return "float";
    case ExportArgKind::Floats: return "float[]";
    case ExportArgKind::Bool: return "bool";
    case ExportArgKind::Bools: return "bool[]";
    case ExportArgKind::Str: return "str";
    case ExportArgKind::ScalarType: return "ScalarType";
    case ExportArgKind::Layout: return "Layout";
    case ExportArgKind::MemoryFormat: return "MemoryFormat";
    case ExportArgKind::Device: return "Device";
    default: throw std::runtime_error("internal: an export argument of unknown kind");
  }
}

std::mutex stand_ins_mutex;
std::unordered_set<std::string> stand_ins;  // the ops stand_in made, by label

bool is_stand_in(const std::string& label) {
  std::lock_guard<std::mutex> lock(stand_ins_mutex);
  return stand_ins.count(label) > 0;
}

// A stand-in for custom op `n.op` (one a Python library registers, which this libtorch does not
// hold): an operator of the schema the call implies, so the graph holds the call as any other
// node and the rewrite writes it back as it was. It cannot run here; shapes go on past it from
// the program's metadata (capture_shapes), and the composed program calls the library's op where
// the user loads it.
std::shared_ptr<torch::jit::Operator> stand_in(const OpNode& n, const std::string& label) {
  std::string schema = n.op + (n.overload.empty() ? "" : "." + n.overload) + "(";
  for (size_t i = 0; i < n.args.size(); ++i) {
    const Arg& a = n.args[i];
    schema += (i ? ", " : "") + std::string(schema_type(a.kind)) + " " + (a.name.empty() ? "arg" + std::to_string(i) : a.name);
  }
  schema += ") -> ";
  if (n.list_output) {
    schema += "Tensor[]";
  } else {
    schema += "(";
    for (size_t i = 0; i < n.outputs.size(); ++i) schema += i ? ", Tensor" : "Tensor";
    schema += ")";
  }
  std::lock_guard<std::mutex> lock(stand_ins_mutex);
  if (auto op = maybe_operator(n.op, n.overload)) return op;  // made for an earlier program
  stand_ins.insert(label);
  torch::jit::registerOperator(torch::jit::Operator(
      schema,
      [label](torch::jit::Stack&) {
        throw std::runtime_error(label + " is a custom op of a Python library, which runs where that library is loaded");
      },
      c10::AliasAnalysisKind::CONSERVATIVE));
  return maybe_operator(n.op, n.overload);
}

bool is_tensor_type(const c10::TypePtr& t) {
  const c10::TypePtr inner = t->kind() == c10::TypeKind::OptionalType ? t->castRaw<c10::OptionalType>()->getElementType() : t;
  return inner->kind() == c10::TypeKind::TensorType;
}

// A Python number passed where the schema takes a Tensor, as tracing records it: a 0-dim
// wrapped-number constant.
Value* wrapped_number(Graph& g, const at::Tensor& t) {
  at::Tensor c = t.clone();
  c.unsafeGetTensorImpl()->set_wrapped_number(true);
  return g.insertConstant(c);
}

// A name TorchScript keeps as a value's debug name (it refuses integers).
// A Scalar (or Scalar?) argument.
bool is_number_type(const c10::TypePtr& t) {
  if (auto o = t->cast<c10::OptionalType>()) return is_number_type(o->getElementType());
  return t->kind() == c10::TypeKind::NumberType;
}

bool valid_name(const std::string& s) { return !s.empty() && !std::isdigit(static_cast<unsigned char>(s[0])); }

// Each formal of `schema` with the argument `n` gives it (null where none), bound as a call binds
// them: by name, else the next positional one for a formal that is not keyword-only. An argument
// no formal takes is refused.
std::vector<const Arg*> bind(const OpNode& n, const c10::FunctionSchema& schema, const std::string& label) {
  std::vector<const Arg*> positional;
  std::unordered_map<std::string, const Arg*> by_name;
  for (const Arg& a : n.args) {
    if (a.name.empty()) {
      positional.push_back(&a);
    } else {
      by_name[a.name] = &a;
    }
  }
  std::vector<const Arg*> bound;
  size_t next = 0;
  for (const c10::Argument& formal : schema.arguments()) {
    const Arg* a = nullptr;
    auto it = by_name.find(formal.name());
    if (it != by_name.end()) {
      a = it->second;
      by_name.erase(it);
    } else if (!formal.kwarg_only() && next < positional.size()) {
      a = positional[next++];
    }
    bound.push_back(a);
  }
  if (!by_name.empty() || next < positional.size()) {
    throw std::runtime_error(label + " gets an argument its schema does not name (" +
                             (by_name.empty() ? "a positional one" : by_name.begin()->first) + ")");
  }
  return bound;
}

// A Python number passed where `schema` takes a Tensor (`bound`: its arguments), given to the
// overload of the same op that takes a Scalar there (add_.Tensor(x, 13) as add_.Scalar,
// pow.Tensor_Tensor as Tensor_Scalar), where there is one: every argument named and typed alike,
// in order, but those numbers. ATen computes the Scalar overload through the same wrapped number,
// so the result is the same; but a wrapped-number tensor written as a constant of a TorchScript
// module loses its flag, and torch.jit.load(..., map_location="cuda") moves it to the GPU, where a
// CPU tensor the program makes (BEiT's relative positions) can no longer take it. Else `schema`.
const c10::FunctionSchema& scalar_overload(const OpNode& n, const c10::FunctionSchema& schema,
                                           const std::vector<const Arg*>& bound) {
  const auto& formals = schema.arguments();
  std::vector<bool> number(formals.size(), false);
  bool any = false;
  for (size_t i = 0; i < formals.size(); ++i) {
    const Arg* a = bound[i];
    number[i] = a != nullptr && (a->kind == ExportArgKind::Int || a->kind == ExportArgKind::Float) &&
                formals[i].type()->kind() == c10::TypeKind::TensorType;
    any = any || number[i];
  }
  if (!any) return schema;
  for (const auto& o : torch::jit::getAllOperatorsFor(c10::Symbol::fromQualString(n.op))) {
    const auto& alt = o->schema().arguments();
    if (alt.size() != formals.size() || o->schema().returns().size() != schema.returns().size()) continue;
    bool fits = true;
    for (size_t i = 0; i < alt.size() && fits; ++i) {
      // By name and in order (a graph's inputs are positional); add_.Tensor's alpha is
      // keyword-only where add_.Scalar's is not, and the arguments stay bound as `schema` binds them.
      fits = alt[i].name() == formals[i].name() &&
             (number[i] ? alt[i].type()->kind() == c10::TypeKind::NumberType : *alt[i].type() == *formals[i].type());
    }
    if (fits) return o->schema();
  }
  return schema;
}

struct Builder {
  Graph& g;
  std::unordered_map<std::string, Value*> env;

  Value* named(const std::string& name) {
    auto it = env.find(name);
    if (it == env.end()) throw std::runtime_error("the program reads " + name + " before anything defines it");
    return it->second;
  }

  Value* value(const Arg& a, const c10::Argument& formal) {
    const c10::TypePtr& type = formal.type();
    switch (a.kind) {
      case ExportArgKind::None: return g.insertConstant(c10::IValue());
      case ExportArgKind::Tensor: return named(a.names.at(0));
      case ExportArgKind::SymInt: return named(a.names.at(0));
      case ExportArgKind::Tensors: {
        std::vector<Value*> elems;
        for (const auto& n : a.names) elems.push_back(named(n));
        return g.insertNode(g.createList(c10::TensorType::get(), elems))->output();
      }
      case ExportArgKind::OptionalTensors: {
        std::vector<Value*> elems;
        for (const auto& n : a.names) elems.push_back(n.empty() ? g.insertConstant(c10::IValue()) : named(n));
        return g.insertNode(g.createList(c10::OptionalType::ofTensor(), elems))->output();
      }
      case ExportArgKind::Int:
        if (is_tensor_type(type)) return wrapped_number(g, at::scalar_tensor(a.ints.at(0), at::kLong));
        return g.insertConstant(a.ints.at(0));
      case ExportArgKind::Float:
        if (is_tensor_type(type)) return wrapped_number(g, at::scalar_tensor(a.floats.at(0), at::kDouble));
        return g.insertConstant(a.floats.at(0));
      case ExportArgKind::Bool:
        if (is_tensor_type(type)) return wrapped_number(g, at::scalar_tensor(static_cast<bool>(a.bools.at(0)), at::kBool));
        return g.insertConstant(static_cast<bool>(a.bools.at(0)));
      case ExportArgKind::Ints: {
        const bool symbolic = std::any_of(a.names.begin(), a.names.end(), [](const auto& n) { return !n.empty(); });
        if (!symbolic) return g.insertConstant(c10::IValue(a.ints));
        std::vector<Value*> elems;
        for (size_t i = 0; i < a.ints.size(); ++i) {
          elems.push_back(a.names[i].empty() ? g.insertConstant(a.ints[i]) : named(a.names[i]));
        }
        return g.insertNode(g.createList(c10::IntType::get(), elems))->output();
      }
      case ExportArgKind::Floats: return g.insertConstant(c10::IValue(a.floats));
      case ExportArgKind::Bools: {
        c10::List<bool> l;
        for (bool b : a.bools) l.push_back(b);
        return g.insertConstant(c10::IValue(l));
      }
      case ExportArgKind::Str: return g.insertConstant(a.text);
      case ExportArgKind::ScalarType: return g.insertConstant(static_cast<int64_t>(dtype_of(a.text)));
      case ExportArgKind::Layout:
      case ExportArgKind::MemoryFormat: return g.insertConstant(a.ints.at(0));
      case ExportArgKind::Device: return g.insertConstant(c10::Device(a.text));
      default: throw std::runtime_error("internal: an export argument of unknown kind");
    }
  }

  void add(const OpNode& n, const std::vector<std::vector<int64_t>>& sample) {
    const std::string label = n.op + (n.overload.empty() ? "" : "." + n.overload);
    auto op = maybe_operator(n.op, n.overload);
    const bool custom = n.custom && !n.metas.empty() && (op == nullptr || is_stand_in(label));
    if (custom && op == nullptr) op = stand_in(n, label);
    if (op == nullptr && n.custom) {
      throw std::runtime_error("the program calls " + label +
                               ", a custom op of another library, and holds no tensor metadata of its outputs: fact "
                               "cannot read past it; export the model with that op's plain PyTorch path");
    }
    if (op == nullptr) {
      throw std::runtime_error("no operator " + label +
                               " in this libtorch: the program comes from another torch version; export it with torch 2.11");
    }
    const std::vector<const Arg*> bound = bind(n, op->schema(), label);
    // The Scalar overload, where one takes the numbers, has the same formals in the same order.
    const c10::FunctionSchema& schema = scalar_overload(n, op->schema(), bound);
    std::vector<Value*> inputs;
    // A bool given as a Scalar becomes an int only for an op whose dtype argument
    // then says bool, which computes as eagerly (full(size, True) is a bool tensor); any other op keeps
    // no operator, and the shapes after it stay unknown rather than wrong.
    const auto dtype_at = schema.argumentIndexWithName("dtype");
    bool bool_scalar = false;
    for (size_t i = 0; i < schema.arguments().size(); ++i) {
      const c10::Argument& formal = schema.arguments()[i];
      const Arg* a = bound[i];
      if (a != nullptr && a->kind == ExportArgKind::Bool && is_number_type(formal.type()) && dtype_at) {
        // A Scalar is a number to TorchScript, which a bool is not: the same value as an int,
        // the dtype made bool below.
        bool_scalar = true;
        inputs.push_back(g.insertConstant(static_cast<int64_t>(a->bools.at(0) ? 1 : 0)));
      } else if (a != nullptr) {
        inputs.push_back(value(*a, formal));
      } else if (formal.default_value()) {
        inputs.push_back(g.insertConstant(*formal.default_value()));
      } else {
        throw std::runtime_error(label + " gets no argument " + formal.name() + ", which has no default");
      }
    }
    if (bool_scalar && dtype_at && inputs[*dtype_at]->type()->kind() == c10::TypeKind::NoneType) {
      Node* none = inputs[*dtype_at]->node();
      inputs[*dtype_at] = g.insertConstant(static_cast<int64_t>(at::kBool));
      if (none->output()->uses().empty()) none->destroy();
    }
    const size_t nouts = schema.returns().size();
    Node* node = g.create(c10::Symbol::fromQualString(n.op), inputs, nouts);
    for (size_t i = 0; i < nouts; ++i) {
      c10::TypePtr t = schema.returns()[i].type();
      if (t->kind() == c10::TypeKind::SymIntType) t = c10::IntType::get();
      node->output(i)->setType(t);
    }
    if (!n.scope.empty()) {
      auto scope = c10::make_intrusive<torch::jit::Scope>();
      size_t start = 0;
      while (start <= n.scope.size()) {
        const size_t end = n.scope.find('/', start);
        scope = scope->push(c10::Symbol::scope(n.scope.substr(start, end - start)));
        if (end == std::string::npos) break;
        start = end + 1;
      }
      node->setScope(scope);
    }
    if (custom) {
      // What capture_shapes reads: the outputs at the sample, and the sample's input sizes.
      node->i_(c10::Symbol::attr("fact_custom_op"), 1);
      for (size_t i = 0; i < n.metas.size(); ++i) {
        const std::string k = std::to_string(i);
        node->i_(c10::Symbol::attr("fact_dtype_" + k), static_cast<int64_t>(n.metas[i].dtype));
        node->is_(c10::Symbol::attr("fact_sizes_" + k), n.metas[i].sizes);
        node->is_(c10::Symbol::attr("fact_strides_" + k), n.metas[i].strides);
      }
      for (size_t i = 0; i < sample.size(); ++i) node->is_(c10::Symbol::attr("fact_sample_" + std::to_string(i)), sample[i]);
    }
    g.insertNode(node);
    auto name = [&](Value* v, const std::string& s) {
      if (s.empty()) return;
      env[s] = v;
      // Names the program's values keep (the writer reads them back); a name TorchScript
      // would read as its own suffix stays unset.
      if (valid_name(s)) v->setDebugName(s);
    };
    if (n.list_output) {
      if (nouts != 1) throw std::runtime_error(label + " returns a list in the program but not in its schema");
      Node* unpack = g.insertNode(g.createListUnpack(node->output(), n.outputs.size()));
      for (size_t i = 0; i < n.outputs.size(); ++i) name(unpack->output(i), n.outputs[i]);
    } else {
      if (n.outputs.size() > nouts) throw std::runtime_error(label + " returns fewer values than the program reads");
      for (size_t i = 0; i < n.outputs.size(); ++i) name(node->output(i), n.outputs[i]);
    }
  }
};

torch::jit::Module build(const Program& p) {
  auto cu = std::make_shared<torch::jit::CompilationUnit>();
  auto cls = c10::ClassType::create(c10::QualifiedName("__torch__.fact.ExportedProgram"), cu, /*is_module=*/true);
  cu->register_type(cls);
  torch::jit::Module m(cu, cls);
  m.register_attribute("training", c10::BoolType::get(), false);
  for (size_t i = 0; i < p.state.size(); ++i) {
    const std::string& attr = p.state[i].second;
    const at::Tensor& t = p.tensors.at(attr);
    if (p.inline_constant[i]) continue;
    if (p.parameter[i]) {
      m.register_parameter(attr, t, /*is_buffer=*/false);
    } else {
      m.register_buffer(attr, t);
    }
  }
  auto g = std::make_shared<Graph>();
  Builder b{*g, {}};
  Value* self = g->addInput("self")->setType(cls);
  for (size_t i = 0; i < p.state.size(); ++i) {
    const auto& [name, attr] = p.state[i];
    Value* v = p.inline_constant[i] ? g->insertConstant(p.tensors.at(attr)) : g->insertGetAttr(self, attr);
    if (valid_name(name)) v->setDebugName(name);
    b.env[name] = v;
  }
  for (const auto& name : p.inputs) {
    Value* v = g->addInput();
    v->setType(c10::TensorType::get());
    if (valid_name(name)) v->setDebugName(name);
    b.env[name] = v;
  }
  for (const OpNode& n : p.nodes) b.add(n, p.sample);
  if (p.outputs.size() == 1) {
    g->registerOutput(b.named(p.outputs[0]));
  } else {
    std::vector<Value*> outs;
    for (const auto& name : p.outputs) outs.push_back(b.named(name));
    g->registerOutput(g->insertNode(g->createTuple(outs))->output());
  }
  auto fn = cu->create_function(c10::QualifiedName(*cls->name(), "forward"), g);
  cls->addMethod(fn);
  return m;
}

std::shared_ptr<const Program> find_program(const std::string& path) {
  std::lock_guard<std::mutex> lock(programs_mutex);
  auto it = programs.find(path);
  return it == programs.end() ? nullptr : it->second;
}

}  // namespace

void register_export(rust::Str path, const ExportProgram& program) {
  try {
    const std::string p = to_std(path);
    auto prog = std::make_shared<Program>();
    caffe2::serialize::PyTorchStreamReader reader(p);
    std::unordered_map<std::string, int> taken = {{"training", 1}};
    // Tied weights (GPT-2's wte and lm_head) name one record: one tensor, read once.
    std::unordered_map<std::string, at::Tensor> by_record;
    for (const ExportState& s : program.state) {
      const std::string attr = attribute_name(std::string(s.attr), taken);
      prog->state.emplace_back(std::string(s.name), attr);
      prog->parameter.push_back(s.parameter);
      const std::string rec = to_std(s.record);
      const std::vector<int64_t> sizes(s.sizes.begin(), s.sizes.end());
      auto it = by_record.find(rec);
      at::Tensor t;
      if (it != by_record.end() && it->second.sizes().vec() == sizes && it->second.scalar_type() == dtype_of(std::string(s.dtype))) {
        t = it->second;
      } else {
        t = payload(reader, s);
        by_record[rec] = t;
      }
      prog->tensors[attr] = t;
      prog->inline_constant.push_back(s.constant && t.numel() <= 1);
    }
    for (const auto& i : program.inputs) prog->inputs.emplace_back(std::string(i));
    for (const auto& o : program.outputs) prog->outputs.emplace_back(std::string(o));
    for (const ExportTensorMeta& m : program.sample) prog->sample.emplace_back(m.sizes.begin(), m.sizes.end());
    for (const ExportNode& n : program.nodes) {
      OpNode o;
      o.op = std::string(n.op);
      o.overload = std::string(n.overload);
      o.list_output = n.list_output;
      o.scope = std::string(n.scope);
      o.custom = n.custom;
      for (const auto& out : n.outputs) o.outputs.emplace_back(std::string(out));
      for (const ExportTensorMeta& m : n.metas) {
        o.metas.push_back({dtype_of(std::string(m.dtype)), {m.sizes.begin(), m.sizes.end()}, {m.strides.begin(), m.strides.end()}});
      }
      for (const ExportArg& a : n.args) {
        Arg arg;
        arg.name = std::string(a.name);
        arg.kind = a.kind;
        for (const auto& s : a.names) arg.names.emplace_back(std::string(s));
        arg.ints.assign(a.ints.begin(), a.ints.end());
        arg.floats.assign(a.floats.begin(), a.floats.end());
        arg.bools.assign(a.bools.begin(), a.bools.end());
        arg.text = std::string(a.text);
        o.args.push_back(std::move(arg));
      }
      prog->nodes.push_back(std::move(o));
    }
    prog->samples = sample_inputs(reader);
    // Built once here so that a program the bridge cannot build fails now, with its reason.
    build(*prog);
    std::lock_guard<std::mutex> lock(programs_mutex);
    programs[p] = std::move(prog);
  } catch (const c10::Error& e) {
    throw std::runtime_error(e.what_without_backtrace());
  }
}

bool is_export(const std::string& path) { return find_program(path) != nullptr; }

torch::jit::Module load_module(const std::string& path) {
  if (auto p = find_program(path)) return build(*p);
  return torch::jit::load(path, at::Device(at::kCPU));
}

std::string export_placeholder(const std::string& path, const std::string& attr) {
  auto p = find_program(path);
  if (!p) return "";
  for (const auto& [name, a] : p->state) {
    if (a == attr) return name;
  }
  return "";
}

std::vector<at::Tensor> export_samples(const std::string& path) {
  auto p = find_program(path);
  if (!p) return {};
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : p->samples) out.push_back(t.clone());
  return out;
}

}  // namespace fact::bridge
