// Values a forward computes from its inputs' shapes and the module's state (buffers and
// parameters) alone, computed once per key (see memoize_static_values in ir.h). A traced decoder
// builds its causal mask from `arange(x.size(1))` and its rotary cos and sin from the `inv_freq`
// buffer and the positions, on every forward: some fifty small ops the host issues before the
// first GEMM while the GPU idles. A windowed or relative-position vision transformer (Swin, BEiT)
// gathers each block's position bias from its parameter table by a buffer index, and lays it out,
// on every forward too. Their values are a function of the shapes they read and the state, so the
// op library keeps them (templates/torch_op.cpp.hbs, memo_get and memo_put) and a forward at known
// shapes issues none of them. The key holds each state tensor's identity and version counter (a
// parameter loaded or changed in place is a new key), and no value is kept while autograd records
// through a parameter. The original ops stay in the graph, run where the memo has no entry.
#include "fact/src/torch/ir.h"

#include <torch/csrc/jit/api/function_impl.h>

#include <algorithm>
#include <random>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace fact::bridge {
namespace {

using torch::jit::Block;
using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

bool is_module(const Value* v) {
  const auto cls = v->type()->cast<c10::ClassType>();
  return cls != nullptr && cls->is_module();
}

// Whether node `n` computes a tensor of its own (no view, no metadata read): a memo of views alone
// would cost the host as much as it saves.
bool computes(const Node* n) {
  const c10::FunctionSchema* schema = n->maybeSchema();
  if (schema == nullptr || !n->kind().is_aten()) return false;
  for (size_t i = 0; i < n->outputs().size() && i < schema->returns().size(); ++i) {
    if (is_tensor(n->outputs()[i]) && schema->returns()[i].alias_info() == nullptr) return true;
  }
  return false;
}

// The values of the top-level block that are fixed by the inputs' shapes and the module's state:
// constants, the module and its submodules, its buffers and parameters (training changes the
// latter, in place or by a new tensor, and autograd tracks them: the memo's key tells both apart
// at run time), metadata reads of any tensor, and what pure ops compute from these. A value that
// an op writes (in place, through a view) is none of them, and neither is a state tensor the
// forward writes through any of its reads (or one sharing its memory).
struct StaticValues {
  std::unordered_set<const Node*> nodes;
  std::unordered_set<const Value*> values;
  std::unordered_set<const Value*> buffers;  // the state reads (buffers and parameters)
  std::unordered_set<const Value*> returned;  // those the graph returns (through an alias)
  // Each static tensor written in place (`written_in_place`): its nodes, which a memo takes whole.
  std::vector<std::vector<Node*>> fresh;
  std::unordered_map<const Node*, size_t> fresh_of;
};

// Whether the list `list` builds is only read: every use an op's argument that no write aliases.
bool list_read_only(const Node* list) {
  for (const torch::jit::Use& u : list->output()->uses()) {
    const c10::FunctionSchema* schema = u.user->maybeSchema();
    if (schema == nullptr || u.offset >= schema->arguments().size()) return false;
    const c10::AliasInfo* info = schema->arguments()[u.offset].alias_info();
    if (info != nullptr && info->isWrite()) return false;
  }
  return true;
}

// A tensor that a pure op makes and ops then write in place, as Swin builds its shift mask
// (`new_zeros`, then `fill_` through slices of it) and BEiT its relative position index (`x[..] +=
// c`, traced as a write of the sum back into a view of x): the maker, the views of it and the
// writes, in graph order; nullopt where its value is not one the memo can keep: the graph returns
// it, control flow, a list or an op of unknown effects takes it, a write sits in a block, or an op
// other than its own writes reads it (to make a tensor of its own) before its last write.
std::optional<std::vector<Node*>> written_in_place(const Graph& g, Node* maker,
                                                   const std::unordered_map<const Node*, size_t>& pos) {
  std::vector<Node*> nodes = {maker};
  std::vector<Value*> todo(maker->outputs().begin(), maker->outputs().end());
  std::vector<Value*> values = todo;
  std::unordered_set<const Value*> seen(todo.begin(), todo.end());
  size_t last_write = 0;
  bool written = false;
  // Its views and writes, through the uses that may alias it.
  while (!todo.empty()) {
    Value* at = todo.back();
    todo.pop_back();
    for (const torch::jit::Use& u : at->uses()) {
      Node* user = u.user;
      // A list an op only reads (BEiT's index into its bias table) reads it where it is built.
      if (user->kind() == c10::prim::ListConstruct && user->owningBlock() == g.block()) {
        if (!list_read_only(user)) return std::nullopt;
        continue;
      }
      const c10::FunctionSchema* schema = user->maybeSchema();
      if (user == g.return_node() || schema == nullptr || !user->blocks().empty() ||
          user->owningBlock() != g.block() || u.offset >= schema->arguments().size()) {
        return std::nullopt;
      }
      const c10::AliasInfo* info = schema->arguments()[u.offset].alias_info();
      if (info == nullptr) continue;
      if (info->isWrite()) {
        written = true;
        last_write = std::max(last_write, pos.at(user));
      }
      if (std::find(nodes.begin(), nodes.end(), user) == nodes.end()) nodes.push_back(user);
      for (Value* out : user->outputs()) {
        if (seen.insert(out).second) {
          todo.push_back(out);
          values.push_back(out);
        }
      }
    }
  }
  if (!written) return std::nullopt;
  // Its reads by other ops (a read of its sizes sees the same before and after a write).
  for (const Value* v : values) {
    for (const torch::jit::Use& u : v->uses()) {
      if (std::find(nodes.begin(), nodes.end(), u.user) != nodes.end() || reads_metadata_only(u.user, u.offset)) continue;
      if (u.user->owningBlock() != g.block() || pos.at(u.user) < last_write) return std::nullopt;
    }
  }
  std::sort(nodes.begin(), nodes.end(), [&](const Node* a, const Node* b) { return pos.at(a) < pos.at(b); });
  return nodes;
}

// One pass of `static_values`, taking the tensors written in place of `fresh` (by index) whole.
StaticValues static_pass(torch::jit::Module& m, Graph& g, const std::vector<at::Tensor>& written,
                         const std::vector<std::vector<Node*>>& fresh, const std::vector<bool>& allowed) {
  static const std::unordered_set<c10::Symbol> pure_prims = {
      c10::prim::Constant,    c10::prim::ListConstruct, c10::prim::ListUnpack, c10::prim::TupleConstruct,
      c10::prim::TupleUnpack, c10::prim::TupleIndex,    c10::prim::NumToTensor, c10::prim::device,
      c10::prim::dtype,       c10::prim::layout};
  StaticValues s;
  for (size_t i = 0; i < fresh.size(); ++i) {
    if (!allowed[i]) continue;
    for (const Node* n : fresh[i]) s.fresh_of.emplace(n, i);
  }
  s.fresh = fresh;
  if (!g.inputs().empty() && is_module(g.inputs()[0])) s.values.insert(g.inputs()[0]);
  for (Node* n : g.block()->nodes()) {
    // A node of a tensor written in place: its writes and views are the tensor's making.
    const bool in_fresh = s.fresh_of.count(n) > 0;
    bool ok = n->blocks().empty() && (in_fresh || !n->hasSideEffects()) && !n->isNondeterministic();
    if (ok && n->kind() == c10::prim::GetAttr) {
      Value* out = n->output();
      if (!s.values.count(n->input(0))) {
        ok = false;
      } else if (!is_module(out)) {
        const std::optional<at::Tensor> t = is_tensor(out) ? state_read(m, g, out, true) : std::nullopt;
        ok = t.has_value() && !shares_memory(written, *t);
      }
    } else if (ok && (pure_prims.count(n->kind()) > 0 || n->kind().is_aten())) {
      const c10::FunctionSchema* schema = n->maybeSchema();
      if (n->kind().is_aten()) ok = schema != nullptr && (in_fresh || !schema->is_mutable());
      for (size_t i = 0; ok && i < n->inputs().size(); ++i) {
        const Value* v = n->input(i);
        ok = s.values.count(v) > 0 || (is_tensor(v) && reads_metadata_only(n, i));
      }
    } else {
      ok = false;
    }
    std::vector<const Value*> returned;
    for (Value* out : n->outputs()) {
      if (!ok || !is_tensor(out) || in_fresh) continue;
      const Fate f = fate(g, out);
      ok = !f.written;
      if (f.returned) returned.push_back(out);
    }
    if (!ok) continue;
    s.returned.insert(returned.begin(), returned.end());
    s.nodes.insert(n);
    for (const Value* out : n->outputs()) s.values.insert(out);
    if (n->kind() == c10::prim::GetAttr && is_tensor(n->output())) s.buffers.insert(n->output());
  }
  return s;
}

StaticValues static_values(torch::jit::Module& m, Graph& g) {
  std::unordered_map<const Node*, size_t> pos;
  size_t i = 0;
  for (const Node* n : g.block()->nodes()) pos.emplace(n, i++);
  pos.emplace(g.return_node(), i);
  // The tensors a pure aten op makes and others write in place: candidates, each kept where every
  // one of its nodes turns out static (its writes' other operands fixed by the shapes and state),
  // found again without those that do not.
  std::vector<std::vector<Node*>> fresh;
  for (Node* n : g.block()->nodes()) {
    const c10::FunctionSchema* schema = n->maybeSchema();
    if (!n->kind().is_aten() || schema == nullptr || schema->is_mutable() || n->outputs().size() != 1 ||
        !is_tensor(n->output()) || (!schema->returns().empty() && schema->returns()[0].alias_info() != nullptr)) {
      continue;
    }
    if (std::optional<std::vector<Node*>> nodes = written_in_place(g, n, pos)) fresh.push_back(std::move(*nodes));
  }
  const std::vector<at::Tensor> written = written_state(m, g);
  std::vector<bool> allowed(fresh.size(), true);
  while (true) {
    StaticValues s = static_pass(m, g, written, fresh, allowed);
    bool dropped = false;
    for (size_t k = 0; k < fresh.size(); ++k) {
      if (!allowed[k]) continue;
      if (std::all_of(fresh[k].begin(), fresh[k].end(), [&](const Node* n) { return s.nodes.count(n) > 0; })) continue;
      allowed[k] = false;
      dropped = true;
    }
    if (!dropped) return s;
  }
}

// One memo: the values it keeps, the static nodes that compute them (in graph order), the tensors
// its key reads the metadata of, the buffers it reads, and the node before which it is computed
// (the first that reads one of its values).
struct Memo {
  std::vector<Value*> values;
  std::vector<Node*> nodes;
  std::vector<Value*> shapes, buffers;
  Node* at = nullptr;
};

// The nodes of `pure` (static ones: no effect but their outputs) nothing reads any more, last
// first so that a node's readers go before it.
void drop_unread(const std::unordered_set<const Node*>& pure, const std::vector<Node*>& order) {
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* n = *it;
    if (!pure.count(n)) continue;
    if (std::all_of(n->outputs().begin(), n->outputs().end(), [](const Value* v) { return !v->hasUses(); })) n->destroy();
  }
}

}  // namespace

// Whether the graph changes a tensor's shape in place anywhere: the key reads the shapes where the
// memo stands, the graph where it reads them, and such an op could tell the two apart, so a graph
// with one keeps its ops.
static bool reshapes_in_place(Graph& g) {
  static const std::unordered_set<std::string> ops = {
      "aten::resize_",  "aten::resize_as_", "aten::set_",     "aten::as_strided_", "aten::squeeze_",
      "aten::unsqueeze_", "aten::transpose_", "aten::t_",     "aten::swapdims_",   "aten::swapaxes_"};
  std::vector<Block*> blocks = {g.block()};
  while (!blocks.empty()) {
    Block* b = blocks.back();
    blocks.pop_back();
    for (Node* n : b->nodes()) {
      if (ops.count(n->kind().toQualString())) return true;
      blocks.insert(blocks.end(), n->blocks().begin(), n->blocks().end());
    }
  }
  return false;
}

std::unordered_set<const Node*> memo_static_nodes(torch::jit::Module& m, Graph& g) {
  if (reshapes_in_place(g)) return {};
  const StaticValues s = static_values(m, g);
  std::unordered_set<const Node*> out;
  for (const Node* n : s.nodes) {
    // A value the graph returns keeps being computed; a view or a constant computes nothing.
    const bool returned = std::any_of(n->outputs().begin(), n->outputs().end(),
                                      [&](const Value* v) { return s.returned.count(v) > 0; });
    // A tensor written in place is made by its writes as much as by its maker.
    if ((computes(n) || s.fresh_of.count(n) > 0) && !returned) out.insert(n);
  }
  return out;
}

void memoize_static_values(torch::jit::Module& m, const std::shared_ptr<Graph>& g) {
  std::vector<Node*> order(g->block()->nodes().begin(), g->block()->nodes().end());
  std::unordered_map<const Node*, size_t> pos;
  for (size_t i = 0; i < order.size(); ++i) pos.emplace(order[i], i);
  pos.emplace(g->return_node(), order.size());

  // The node of the top-level block that holds `n` (itself, or the If or Loop it is nested in).
  auto top_level = [&](Node* n) {
    while (n->owningBlock() != g->block()) n = n->owningBlock()->owningNode();
    return n;
  };
  if (reshapes_in_place(*g)) return;
  std::vector<Memo> memos;
  const StaticValues s = static_values(m, *g);
  {
    // The values to keep: static tensors that a node of the forward reads. One the graph returns
    // (or that may alias what it returns) keeps being computed: the caller may write to it.
    struct Kept {
      Value* value;
      size_t first_use;
    };
    std::vector<Kept> kept;
    for (Node* n : order) {
      // A constant costs nothing to read.
      if (!s.nodes.count(n) || n->kind() == c10::prim::Constant) continue;
      for (Value* out : n->outputs()) {
        if (!is_tensor(out)) continue;
        size_t first = order.size() + 1;
        for (const torch::jit::Use& u : out->uses()) {
          if (!s.nodes.count(u.user)) first = std::min(first, pos.at(top_level(u.user)));
        }
        if (first >= order.size() || s.returned.count(out)) continue;
        kept.push_back({out, first});
      }
    }
    std::stable_sort(kept.begin(), kept.end(), [](const Kept& a, const Kept& b) { return a.first_use < b.first_use; });
    // Memos in the order of their first use; a value joins the open memo where every tensor its
    // key reads is defined before that memo's place, and otherwise opens the next.
    auto before = [&](const Value* v, const Node* at) {
      return v->node() == g->param_node() || pos.at(v->node()) < pos.at(at);
    };
    for (const Kept& k : kept) {
      std::vector<Node*> slice;
      std::vector<Value*> shapes, buffers;
      std::unordered_set<const Node*> seen;
      std::vector<Node*> todo = {k.value->node()};
      while (!todo.empty()) {
        Node* n = todo.back();
        todo.pop_back();
        if (!seen.insert(n).second) continue;
        if (n->kind() == c10::prim::GetAttr && s.buffers.count(n->output())) {
          buffers.push_back(n->output());
          continue;
        }
        // A tensor written in place is made by all of its nodes: its writes read nothing of it
        // that a value's inputs lead to.
        if (auto f = s.fresh_of.find(n); f != s.fresh_of.end()) {
          for (Node* w : s.fresh[f->second]) todo.push_back(w);
        }
        slice.push_back(n);
        for (Value* v : n->inputs()) {
          if (s.nodes.count(v->node())) {
            todo.push_back(v->node());
          } else if (!s.values.count(v)) {
            shapes.push_back(v);  // read for its metadata alone (static_values)
          }
        }
      }
      // A buffer, or views of one, costs nothing to read again.
      if (std::none_of(slice.begin(), slice.end(), computes)) continue;
      if (memos.empty() || !std::all_of(shapes.begin(), shapes.end(), [&](Value* v) { return before(v, memos.back().at); })) {
        memos.push_back(Memo{{}, {}, {}, {}, order[k.first_use]});
      }
      Memo& memo = memos.back();
      memo.values.push_back(k.value);
      memo.nodes.insert(memo.nodes.end(), slice.begin(), slice.end());
      memo.shapes.insert(memo.shapes.end(), shapes.begin(), shapes.end());
      memo.buffers.insert(memo.buffers.end(), buffers.begin(), buffers.end());
    }
  }

  std::random_device random;
  const auto get = c10::Symbol::fromQualString("fact::memo_get");
  const auto put = c10::Symbol::fromQualString("fact::memo_put");
  for (Memo& memo : memos) {
    auto by_place = [&](auto& xs, auto place) {
      std::sort(xs.begin(), xs.end(), [&](auto a, auto b) { return place(a) < place(b); });
      xs.erase(std::unique(xs.begin(), xs.end()), xs.end());
    };
    by_place(memo.nodes, [&](const Node* n) { return pos.at(n); });
    by_place(memo.shapes, [](const Value* v) { return v->unique(); });
    by_place(memo.buffers, [](const Value* v) { return v->unique(); });

    torch::jit::WithInsertPoint guard(memo.at);
    // The buffers, read again here where their reads come later in the graph.
    std::unordered_map<Value*, Value*> env;
    std::vector<Value*> buffers;
    for (Value* b : memo.buffers) {
      Value* read = b;
      if (pos.at(b->node()) >= pos.at(memo.at)) {
        read = g->inputs()[0];
        const std::vector<std::string> path = attribute_path(*g, b).value();
        for (const std::string& name : path) read = g->insertGetAttr(read, name);
        read->setType(b->type());
      }
      env[b] = read;
      buffers.push_back(read);
    }
    // A site is one memo of one composed module: random, so that modules composed apart (their
    // constants may differ where their graphs print alike) never share one.
    const int64_t site = static_cast<int64_t>((static_cast<uint64_t>(random()) << 31) ^ random()) & INT64_MAX;
    Value* site_v = g->insertConstant(site);
    Value* shapes_v = g->insertNode(g->createList(c10::TensorType::get(), memo.shapes))->output();
    Value* state_v = g->insertNode(g->createList(c10::TensorType::get(), buffers))->output();
    Node* got = g->insertNode(g->create(get, {site_v, shapes_v, state_v}, 1));
    got->output()->setType(c10::ListType::ofTensors());
    Value* missing = g->insert(c10::aten::eq, {g->insert(c10::aten::len, {got->output()}), g->insertConstant(0)});
    Node* branch = g->insertNode(g->create(c10::prim::If, {missing}, memo.values.size()));
    Block* compute = branch->addBlock();
    Block* reuse = branch->addBlock();
    for (Node* n : memo.nodes) {
      Node* c = compute->appendNode(g->createClone(n, [&](Value* v) {
        auto it = env.find(v);
        return it == env.end() ? v : it->second;
      }));
      for (size_t i = 0; i < n->outputs().size(); ++i) env[n->output(i)] = c->output(i);
    }
    std::vector<Value*> computed;
    for (Value* v : memo.values) computed.push_back(env.at(v));
    Value* list = compute->appendNode(g->createList(c10::TensorType::get(), computed))->output();
    Node* kept = compute->appendNode(g->create(put, {site_v, shapes_v, state_v, list}, 1));
    kept->output()->setType(c10::ListType::ofTensors());
    Node* fresh = compute->appendNode(g->createListUnpack(kept->output(), memo.values.size()));
    Node* known = reuse->appendNode(g->createListUnpack(got->output(), memo.values.size()));
    for (size_t i = 0; i < memo.values.size(); ++i) {
      compute->registerOutput(fresh->output(i));
      reuse->registerOutput(known->output(i));
      branch->output(i)->setType(c10::TensorType::get());
      // Static nodes keep reading the original (they die below, or feed a later memo's copy).
      Value* v = memo.values[i];
      const std::vector<torch::jit::Use> uses = v->uses();
      for (const torch::jit::Use& u : uses) {
        if (!s.nodes.count(u.user)) u.user->replaceInput(u.offset, branch->output(i));
      }
    }
  }
  drop_unread(s.nodes, order);
}

std::vector<Folded> fold_static_values(torch::jit::Module& m, const std::shared_ptr<Graph>& g, int64_t max_bytes) {
  std::vector<Folded> out;
  if (g->inputs().empty() || !is_module(g->inputs()[0]) || reshapes_in_place(*g)) return out;
  Value* self = g->inputs()[0];
  std::vector<Node*> order(g->block()->nodes().begin(), g->block()->nodes().end());
  const StaticValues s = static_values(m, *g);

  // The static nodes that read no shape, through any of their inputs or the writes of a tensor
  // they make: their values are the state's and the constants' alone.
  std::unordered_set<const Node*> fixed;
  for (Node* n : order) {
    if (s.nodes.count(n)) fixed.insert(n);
  }
  for (bool changed = true; changed;) {
    changed = false;
    for (Node* n : order) {
      if (!fixed.count(n)) continue;
      bool ok = std::all_of(n->inputs().begin(), n->inputs().end(),
                            [&](const Value* v) { return v == self || fixed.count(v->node()) > 0; });
      if (auto f = s.fresh_of.find(n); ok && f != s.fresh_of.end()) {
        ok = std::all_of(s.fresh[f->second].begin(), s.fresh[f->second].end(),
                         [&](const Node* w) { return fixed.count(w) > 0; });
      }
      if (!ok) fixed.erase(n), changed = true;
    }
  }
  std::unordered_map<const Node*, size_t> pos;
  for (size_t i = 0; i < order.size(); ++i) pos.emplace(order[i], i);

  // The roots: such tensors that a node of another kind reads (the forward, or a static value the
  // shapes fix, as BEiT adds its fixed position bias to a mask over the batch), each with the
  // nodes that compute it.
  struct Root {
    Value* value;
    std::vector<Node*> nodes;
    std::vector<Value*> buffers;
    at::Tensor tensor;
  };
  std::vector<Root> roots;
  for (Node* n : order) {
    if (!fixed.count(n) || n->kind() == c10::prim::Constant) continue;
    for (Value* v : n->outputs()) {
      if (!is_tensor(v) || s.returned.count(v) || !program_named(v)) continue;
      const bool read = std::any_of(v->uses().begin(), v->uses().end(),
                                    [&](const torch::jit::Use& u) { return !fixed.count(u.user); });
      if (!read) continue;
      Root r{v, {}, {}, {}};
      std::unordered_set<const Node*> seen;
      std::vector<Node*> todo = {n};
      while (!todo.empty()) {
        Node* x = todo.back();
        todo.pop_back();
        if (!seen.insert(x).second) continue;
        if (x->kind() == c10::prim::GetAttr && s.buffers.count(x->output())) {
          r.buffers.push_back(x->output());
          continue;
        }
        if (auto f = s.fresh_of.find(x); f != s.fresh_of.end()) {
          for (Node* w : s.fresh[f->second]) todo.push_back(w);
        }
        r.nodes.push_back(x);
        for (Value* in : x->inputs()) {
          if (in != self) todo.push_back(in->node());
        }
      }
      // A buffer, or views of one, costs nothing to read.
      if (std::none_of(r.nodes.begin(), r.nodes.end(), computes)) continue;
      std::sort(r.nodes.begin(), r.nodes.end(), [&](const Node* a, const Node* b) { return pos.at(a) < pos.at(b); });
      roots.push_back(std::move(r));
    }
  }

  // Each root computed here from the module's state: a graph of its nodes alone, run by the
  // interpreter. One that fails to run, or is larger than `max_bytes`, stays in the forward.
  for (Root& r : roots) {
    try {
      auto eg = std::make_shared<Graph>();
      Value* me = eg->addInput("self");
      me->setType(self->type());
      std::unordered_map<Value*, Value*> env = {{self, me}};
      for (Value* b : r.buffers) {
        Value* read = me;
        const std::vector<std::string> path = attribute_path(*g, b).value();
        for (const std::string& name : path) read = eg->insertGetAttr(read, name);
        read->setType(b->type());
        env[b] = read;
      }
      for (Node* n : r.nodes) {
        Node* c = eg->appendNode(eg->createClone(n, [&](Value* v) {
          auto it = env.find(v);
          if (it == env.end()) throw std::runtime_error("a fixed value reads one outside its nodes");
          return it->second;
        }));
        for (size_t i = 0; i < n->outputs().size(); ++i) env[n->output(i)] = c->output(i);
      }
      eg->registerOutput(env.at(r.value));
      torch::jit::GraphFunction fn("fact_fold", eg, nullptr);
      torch::NoGradGuard no_grad;
      at::Tensor t = fn({m._ivalue()}).toTensor().detach().contiguous().clone();
      if (t.numel() * static_cast<int64_t>(t.element_size()) <= max_bytes) r.tensor = std::move(t);
    } catch (const std::exception&) {
      // Left to the forward, as without folding.
    }
  }

  // A folded value's node must go with the fold (the buffer takes its name): drop each root that
  // a computation the forward keeps still reads through, until none is.
  for (bool dropped = true; dropped;) {
    dropped = false;
    std::unordered_set<const Value*> folded;
    for (const Root& r : roots) {
      if (r.tensor.defined()) folded.insert(r.value);
    }
    std::unordered_set<const Node*> alive;
    std::vector<Node*> todo;
    for (Node* n : order) {
      if (!fixed.count(n)) continue;
      for (const Value* o : n->outputs()) {
        if (folded.count(o)) continue;
        for (const torch::jit::Use& u : o->uses()) {
          if (!fixed.count(u.user)) todo.push_back(n);
        }
      }
    }
    while (!todo.empty()) {
      Node* n = todo.back();
      todo.pop_back();
      if (!alive.insert(n).second) continue;
      if (auto f = s.fresh_of.find(n); f != s.fresh_of.end()) {
        for (Node* w : s.fresh[f->second]) todo.push_back(w);
      }
      for (Value* v : n->inputs()) {
        if (fixed.count(v->node())) todo.push_back(v->node());
      }
    }
    for (Root& r : roots) {
      if (r.tensor.defined() && alive.count(r.value->node())) r.tensor = at::Tensor(), dropped = true;
    }
  }

  torch::jit::WithInsertPoint guard(g->block()->nodes().front());
  for (Root& r : roots) {
    if (!r.tensor.defined()) continue;
    const std::string attr = "fact_fold_" + std::to_string(out.size());
    m.register_buffer(attr, r.tensor);
    Value* read = g->insertGetAttr(self, attr);
    read->setType(c10::TensorType::create(r.tensor));
    const std::vector<torch::jit::Use> uses = r.value->uses();
    for (const torch::jit::Use& u : uses) {
      if (!fixed.count(u.user)) u.user->replaceInput(u.offset, read);
    }
    out.push_back(Folded{r.value->debugName(), attr, r.tensor});
  }
  drop_unread(fixed, order);
  return out;
}

}  // namespace fact::bridge
