//! The torch.export front end: reads a `.pt2` archive written by `torch.export.save` (its JSON
//! program, signature, weights and constants, sample inputs) and hands the bridge a program it
//! builds a TorchScript module from (export.cc), so that the graph the rules read, the mask
//! classes, the memo's facts and the rewrite are those of TorchScript archives: one graph, two
//! formats. What export spells differently is normalised once, here and in export.cc: a
//! higher-order op that only switches grad or autocast off is inlined, assertions are dropped,
//! `sym_size.int` reads as `aten::size`, `to.dtype_layout` as `aten::to.dtype`, and Python's int
//! arithmetic on sizes as TorchScript's. The archive's own JSON, normalised the same way, is what
//! the writer (write.rs) edits, so a composed program keeps every node fact did not replace
//! verbatim. Never touches the GPU.

mod heads_bmm;
mod mha;
mod nodes;
pub mod schema;
pub mod write;

use super::ffi;
use schema::{Argument, InputSpec, NamedArgument, OutputSpec, SymIntArgument};
use serde_json::Value as Json;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// A `.pt2` archive fact can read: its program (normalised), its payload configs and what the
/// plan says of its dynamic dims.
pub struct Program {
    /// `models/<name>.json` after normalisation, as JSON: the writer's base.
    pub json: Json,
    pub program: schema::ExportedProgram,
    /// The record holding the program (`models/model.json`).
    pub record: String,
    pub weights: schema::PayloadConfig,
    pub constants: schema::PayloadConfig,
    /// Every dynamic dim of a user input: (input index, dim, symbol, min, max).
    pub dynamic: Vec<DynamicDim>,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct DynamicDim {
    pub input: usize,
    pub dim: usize,
    pub symbol: String,
    pub min: Option<i64>,
    pub max: Option<i64>,
    /// The sample's size, which fact tunes at.
    pub sample: i64,
}

impl DynamicDim {
    /// Whether the range holds sizes above the sample's (an unbounded one does).
    pub fn past_sample(&self) -> bool {
        self.max.is_none_or(|m| m > self.sample)
    }

    /// `input 1 dim 0 (s23) in [2, inf), tuned at 8`.
    pub fn describe(&self) -> String {
        let max = self.max.map_or("inf)".to_string(), |m| format!("{m}]"));
        format!(
            "input {} dim {} ({}) in [{}, {max}, tuned at {}",
            self.input + 1,
            self.dim,
            self.symbol,
            self.min.unwrap_or(0),
            self.sample
        )
    }
}

/// Why a `.pt2` cannot be read; each message names the fix.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("{path}: {what}")]
    Bad { path: String, what: String },
}

fn bad(path: &str, what: impl Into<String>) -> ExportError {
    ExportError::Bad {
        path: path.to_string(),
        what: what.into(),
    }
}

/// Higher-order ops whose body runs as if inlined in an inference program: they only switch grad
/// (export records a model's `torch.no_grad()` blocks) or autocast off around it.
fn inlinable(target: &str, node: &Json) -> Result<bool, String> {
    match target {
        "torch.ops.higher_order.wrap_with_set_grad_enabled" => Ok(true),
        "torch.ops.higher_order.wrap_with_autocast" => {
            // (device_type, dtype, enabled, cache_enabled, graph, *args): only a region that
            // turns autocast off is the same function inlined (the program does not run under
            // autocast).
            let enabled = node["inputs"]
                .as_array()
                .and_then(|a| a.get(2))
                .and_then(|a| a["arg"]["as_bool"].as_bool());
            match enabled {
                Some(false) => Ok(true),
                _ => Err("the program turns autocast on inside (torch.autocast in the model's forward): fact reads programs that run in one dtype; export the model with its weights in that dtype and no autocast region".into()),
            }
        }
        _ => Ok(false),
    }
}

/// Ops that pass their input on unchanged in an inference program: export wraps each read of a
/// lifted tensor constant in `detach_(lift_fresh_copy(c))`, which TorchScript reads as the
/// constant itself. Their outputs are renamed to their inputs.
fn is_passthrough(target: &str) -> bool {
    matches!(
        target,
        "torch.ops.aten.lift_fresh_copy.default"
            | "torch.ops.aten.detach_.default"
            | "torch.ops.aten.detach.default"
    )
}

/// Ops that only assert (no outputs): their checks are export's, not the computation's.
fn is_assertion(target: &str) -> bool {
    matches!(
        target,
        "torch.ops.aten._assert_tensor_metadata.default"
            | "torch.ops.aten._assert_scalar.default"
            | "torch.ops.aten._assert_async.msg"
            | "torch.ops.aten._assert_async.default"
            | "torch.ops.aten.sym_constrain_range_for_size.default"
            | "torch.ops.aten.sym_constrain_range.default"
            | "torch.ops.aten._functional_assert_async.msg"
    )
}

/// Renames, in a subgraph's JSON, every value name in `names` (tensor arguments and symbolic
/// names, inputs, outputs and node names) through `rename`; metadata is left as it is.
fn rename_values(v: &mut Json, rename: &HashMap<String, String>) {
    match v {
        Json::Object(map) => {
            // A named argument's "name" is its schema's argument name, not a value's.
            let argument = map.contains_key("arg");
            for (k, child) in map.iter_mut() {
                if k == "metadata" || (argument && k == "name") {
                    continue;
                }
                if (k == "name" || k == "as_name") && child.is_string() {
                    if let Some(new) = rename.get(child.as_str().unwrap()) {
                        *child = Json::String(new.clone());
                    }
                    continue;
                }
                rename_values(child, rename);
            }
        }
        Json::Array(items) => items.iter_mut().for_each(|c| rename_values(c, rename)),
        _ => {}
    }
}

/// The names an output list of a node (or a graph's outputs) defines or reads, in order.
fn arg_names(args: &Json) -> Vec<String> {
    let parsed: Vec<Argument> = serde_json::from_value(args.clone()).unwrap_or_default();
    parsed.iter().flat_map(Argument::defined_names).collect()
}

/// Normalises a graph's JSON in place: inlines the higher-order ops that only switch grad or
/// autocast off (their bodies' values renamed apart, their outputs keeping the op's names) and
/// drops assertions. Nested bodies are normalised first.
fn normalise_graph(graph: &mut Json, path: &str) -> Result<HashMap<String, String>, ExportError> {
    let nodes = graph["nodes"].as_array().cloned().unwrap_or_default();
    let mut out = Vec::with_capacity(nodes.len());
    let mut tensor_values = graph["tensor_values"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let mut sym_values = graph["sym_int_values"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    // Outputs of passthrough ops, each to the value it passes on; later readers read that.
    let mut through: HashMap<String, String> = HashMap::new();
    for mut node in nodes {
        let target = node["target"].as_str().unwrap_or_default().to_string();
        if is_assertion(&target) {
            continue;
        }
        if !through.is_empty() {
            rename_values(&mut node["inputs"], &through);
        }
        if is_passthrough(&target) {
            let input = node["inputs"][0]["arg"]["as_tensor"]["name"]
                .as_str()
                .map(str::to_string);
            let outputs = arg_names(&node["outputs"]);
            if let (Some(input), [output]) = (input, outputs.as_slice()) {
                through.insert(output.clone(), input);
                continue;
            }
        }
        if !target.starts_with("torch.ops.higher_order.") {
            out.push(node);
            continue;
        }
        match inlinable(&target, &node) {
            Ok(true) => {}
            Ok(false) => {
                return Err(bad(
                    path,
                    format!("the program calls {target}, control flow fact does not read; export the model without it (torch.cond and loops are not patterns fact replaces)"),
                ))
            }
            Err(why) => return Err(bad(path, why)),
        }
        let inputs = node["inputs"].as_array().cloned().unwrap_or_default();
        let Some(at) = inputs
            .iter()
            .position(|i| i["arg"].get("as_graph").is_some())
        else {
            return Err(bad(path, format!("{target} without a body graph")));
        };
        let sub_name = inputs[at]["arg"]["as_graph"]["name"]
            .as_str()
            .unwrap_or("submod")
            .to_string();
        let mut body = inputs[at]["arg"]["as_graph"]["graph"].clone();
        let inner = normalise_graph(&mut body, path)?;
        rename_values(&mut body["outputs"], &inner);
        // Body inputs take the operands' names, body outputs the op's, everything else a name
        // of its own.
        let operands: Vec<String> = inputs[at + 1..]
            .iter()
            .flat_map(|i| arg_names(&Json::Array(vec![i["arg"].clone()])))
            .collect();
        let params = arg_names(&body["inputs"]);
        let results = arg_names(&body["outputs"]);
        let outputs = arg_names(&node["outputs"]);
        if params.len() != operands.len() || results.len() != outputs.len() {
            return Err(bad(
                path,
                format!("{target}'s body takes {} inputs and gives {} outputs, the call passes {} and reads {}", params.len(), results.len(), operands.len(), outputs.len()),
            ));
        }
        let mut rename: HashMap<String, String> = HashMap::new();
        for n in body["nodes"].as_array().into_iter().flatten() {
            for name in arg_names(&n["outputs"]) {
                rename.insert(name.clone(), format!("{sub_name}__{name}"));
            }
        }
        for (p, o) in params.iter().zip(&operands) {
            rename.insert(p.clone(), o.clone());
        }
        for (r, o) in results.iter().zip(&outputs) {
            if params.contains(r) {
                return Err(bad(path, format!("{target}'s body returns its input {r} as it is, which fact does not inline")));
            }
            rename.insert(r.clone(), o.clone());
        }
        let old_values = body["tensor_values"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        let old_syms = body["sym_int_values"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        rename_values(&mut body["nodes"], &rename);
        for (k, v) in old_values {
            if params.contains(&k) {
                continue;
            }
            tensor_values.insert(rename.get(&k).cloned().unwrap_or(k), v);
        }
        for (k, v) in old_syms {
            if params.contains(&k) {
                continue;
            }
            sym_values.insert(rename.get(&k).cloned().unwrap_or(k), v);
        }
        out.extend(body["nodes"].as_array().cloned().unwrap_or_default());
    }
    if !through.is_empty() {
        rename_values(&mut graph["outputs"], &through);
    }
    let out = without_dead_nodes(out, &graph["outputs"]);
    graph["nodes"] = Json::Array(out);
    graph["tensor_values"] = Json::Object(tensor_values);
    graph["sym_int_values"] = Json::Object(sym_values);
    Ok(through)
}

/// Whether a node writes an input in place (`add_`, `copy_`, `index_put_`): kept though nothing
/// reads its output.
fn writes_in_place(target: &str) -> bool {
    target
        .strip_prefix("torch.ops.")
        .and_then(|r| r.split('.').nth(1))
        .is_some_and(|name| name.ends_with('_') && !name.starts_with('_'))
}

/// Names read by a node's inputs (any tensor or symbolic argument, nested lists included), into
/// `out`.
fn reads(v: &Json, out: &mut std::collections::HashSet<String>) {
    match v {
        Json::Object(map) => {
            for (k, child) in map {
                if k == "metadata" {
                    continue;
                }
                if (k == "name" || k == "as_name") && !map.contains_key("arg") {
                    if let Some(s) = child.as_str() {
                        out.insert(s.to_string());
                    }
                } else {
                    reads(child, out);
                }
            }
        }
        Json::Array(items) => items.iter().for_each(|c| reads(c, out)),
        _ => {}
    }
}

/// The nodes whose outputs something reads (a later node or the graph's outputs), in order: a
/// trace keeps only those (a Hugging Face pooler whose output the wrapper drops is not traced),
/// and export keeps them all. Nodes that write in place stay.
fn without_dead_nodes(nodes: Vec<Json>, outputs: &Json) -> Vec<Json> {
    let mut read: std::collections::HashSet<String> = arg_names(outputs).into_iter().collect();
    let mut keep = vec![false; nodes.len()];
    for (i, n) in nodes.iter().enumerate().rev() {
        let target = n["target"].as_str().unwrap_or_default();
        let defined = arg_names(&n["outputs"]);
        if writes_in_place(target) || defined.is_empty() || defined.iter().any(|d| read.contains(d))
        {
            keep[i] = true;
            reads(&n["inputs"], &mut read);
        }
    }
    nodes
        .into_iter()
        .zip(keep)
        .filter_map(|(n, k)| k.then_some(n))
        .collect()
}

/// Reads record `name` of the archive (bounded by `limit` bytes).
fn record(path: &str, name: &str) -> Result<Vec<u8>, ExportError> {
    ffi::archive_record(path, name, usize::MAX).map_err(|e| {
        bad(
            path,
            format!(
                "cannot read {name}: {}; save the program again with torch.export.save",
                super::first_line(e.what())
            ),
        )
    })
}

fn payload(
    path: &str,
    records: &[String],
    name: &str,
) -> Result<schema::PayloadConfig, ExportError> {
    if !records.iter().any(|r| r == name) {
        return Ok(schema::PayloadConfig {
            config: BTreeMap::new(),
        });
    }
    serde_json::from_slice(&record(path, name)?).map_err(|e| {
        bad(
            path,
            format!("{name} does not parse ({e}); save the program again with torch.export.save"),
        )
    })
}

/// Reads and normalises the program of the `.pt2` archive at `path`, whose records are
/// `records` (the bridge's listing, without the archive's top folder).
pub fn read(path: &Path, records: &[String]) -> Result<Program, ExportError> {
    let p = path.display().to_string();
    if records.iter().any(|r| r.starts_with("data/aotinductor/"))
        && !records.iter().any(|r| r.starts_with("models/"))
    {
        return Err(bad(&p, "this is an AOTInductor package (compiled code, no graph to read): give fact the program torch.export.save wrote before aoti_compile_and_package"));
    }
    let format = records
        .iter()
        .any(|r| r == "archive_format")
        .then(|| record(&p, "archive_format"))
        .transpose()?
        .map(|b| String::from_utf8_lossy(&b).trim().to_string());
    if let Some(f) = &format {
        if f != "pt2" {
            return Err(bad(
                &p,
                format!("archive format '{f}' is not pt2; save the program with torch.export.save"),
            ));
        }
    }
    let models: Vec<&String> = records
        .iter()
        .filter(|r| r.starts_with("models/") && r.ends_with(".json"))
        .collect();
    let record_name = match models.as_slice() {
        [] => return Err(bad(&p, "the archive holds no models/*.json program (an archive from a torch older than 2.6, or not torch.export.save's); export and save the model again with torch 2.11")),
        [one] => one.to_string(),
        many => many
            .iter()
            .find(|r| r.as_str() == "models/model.json")
            .map(|r| r.to_string())
            .ok_or_else(|| bad(&p, format!("the archive holds {} programs ({}); fact reads one: save one with torch.export.save", many.len(), many.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "))))?,
    };
    let mut json: Json = serde_json::from_slice(&record(&p, &record_name)?)
        .map_err(|e| bad(&p, format!("{record_name} does not parse as JSON ({e}); the archive is damaged: save the program again with torch.export.save")))?;
    let major = json["schema_version"]["major"].as_i64().unwrap_or(-1);
    let minor = json["schema_version"]["minor"].as_i64().unwrap_or(-1);
    if major != schema::KNOWN_MAJOR {
        return Err(bad(
            &p,
            format!(
                "the program's schema version is {major}.{minor}, fact reads {}.x (torch 2.6 to 2.11, whose torch.export.save writes it); export and save the model with torch 2.11",
                schema::KNOWN_MAJOR
            ),
        ));
    }
    let through = normalise_graph(&mut json["graph_module"]["graph"], &p)?;
    mha::batch_first_mha(&mut json["graph_module"]["graph"]);
    heads_bmm::heads_bmm(&mut json["graph_module"]["graph"]);
    rename_values(
        &mut json["graph_module"]["signature"]["output_specs"],
        &through,
    );
    let program: schema::ExportedProgram = serde_json::from_value(json.clone()).map_err(|e| {
        bad(&p, format!("{record_name} is not an exported program fact reads ({e}); export and save the model with torch 2.11"))
    })?;
    check_inference(&p, &program)?;
    let weights = payload(&p, records, "data/weights/model_weights_config.json")?;
    let constants = payload(&p, records, "data/constants/model_constants_config.json")?;
    let dynamic = dynamic_dims(&program);
    Ok(Program {
        json,
        program,
        record: record_name,
        weights,
        constants,
        dynamic,
    })
}

/// A program exported for training (a loss or gradients among its outputs, buffers it updates,
/// dropout that drops) is not one fact composes.
fn check_inference(path: &str, ep: &schema::ExportedProgram) -> Result<(), ExportError> {
    let training = "export the model in inference: model.eval() before torch.export.export, and no loss or backward in the exported function";
    for o in &ep.graph_module.signature.output_specs {
        match o {
            OutputSpec::UserOutput { .. } => {}
            OutputSpec::LossOutput(_)
            | OutputSpec::GradientToParameter(_)
            | OutputSpec::GradientToUserInput(_) => {
                return Err(bad(path, format!("the program was exported for training (it returns a loss or gradients); {training}")));
            }
            OutputSpec::BufferMutation(_)
            | OutputSpec::ParameterMutation(_)
            | OutputSpec::UserInputMutation(_) => {
                return Err(bad(path, format!("the program updates its buffers, parameters or inputs in place (BatchNorm in training mode does); {training}")));
            }
            OutputSpec::Other => {
                return Err(bad(
                    path,
                    "the program has an output kind fact does not know; export it with torch 2.11",
                ))
            }
        }
    }
    for n in &ep.graph_module.graph.nodes {
        let train_arg = |name: &str| {
            n.inputs
                .iter()
                .any(|a| a.name == name && matches!(a.arg, Argument::AsBool(true)))
        };
        let dropout = n.target.contains(".dropout.") || n.target.contains(".native_dropout.");
        let bn = n.target.contains("batch_norm");
        if (dropout && train_arg("train")) || (bn && train_arg("training")) {
            return Err(bad(
                path,
                format!("{} runs in training mode; {training}", n.target),
            ));
        }
    }
    Ok(())
}

/// The dynamic dims of the user inputs, with the range export proved for each.
fn dynamic_dims(ep: &schema::ExportedProgram) -> Vec<DynamicDim> {
    let g = &ep.graph_module.graph;
    let mut out = Vec::new();
    let users = user_inputs(ep);
    for (i, name) in users.iter().enumerate() {
        let Some(meta) = g.tensor_values.get(name) else {
            continue;
        };
        for (d, size) in meta.sizes.iter().enumerate() {
            if let Some(symbol) = size.symbol() {
                let range = ep.range_constraints.get(&symbol);
                out.push(DynamicDim {
                    input: i,
                    dim: d,
                    symbol,
                    min: range.and_then(|r| r.min_val),
                    max: range.and_then(|r| r.max_val),
                    sample: size.hint().unwrap_or(0),
                });
            }
        }
    }
    out
}

/// The names of the user inputs, in order.
pub fn user_inputs(ep: &schema::ExportedProgram) -> Vec<String> {
    ep.graph_module
        .signature
        .input_specs
        .iter()
        .filter_map(|s| match s {
            InputSpec::UserInput { arg } => {
                Some(arg.defined_names().into_iter().next().unwrap_or_default())
            }
            _ => None,
        })
        .collect()
}

/// `torch.ops.aten.addmm.default` as the TorchScript op and overload the bridge builds
/// (`aten::addmm`, ""); export's spellings of what TorchScript writes otherwise are mapped here.
fn op_of(target: &str) -> Option<(String, String)> {
    let int_op = |name: &str| Some((format!("aten::{name}"), "int".to_string()));
    match target {
        "torch.ops.aten.sym_size.int" => return Some(("aten::size".into(), "int".into())),
        "_operator.mul" => return int_op("mul"),
        "_operator.add" => return int_op("add"),
        "_operator.sub" => return int_op("sub"),
        "_operator.floordiv" => return int_op("floordiv"),
        "_operator.mod" => return int_op("remainder"),
        "_operator.neg" => return int_op("neg"),
        "torch.sym_max" => return Some(("prim::max".into(), "int".into())),
        "torch.sym_min" => return Some(("prim::min".into(), "int".into())),
        _ => {}
    }
    let rest = target.strip_prefix("torch.ops.")?;
    let mut parts = rest.splitn(3, '.');
    let (ns, name, overload) = (parts.next()?, parts.next()?, parts.next()?);
    let overload = if overload == "default" { "" } else { overload };
    Some((format!("{ns}::{name}"), overload.to_string()))
}

fn export_arg(name: &str, kind: ffi::ExportArgKind) -> ffi::ExportArg {
    ffi::ExportArg {
        name: name.to_string(),
        kind,
        names: vec![],
        ints: vec![],
        floats: vec![],
        bools: vec![],
        text: String::new(),
    }
}

/// c10's code of an export layout or memory format (they number them differently).
fn c10_layout(code: i64) -> Option<i64> {
    // export: Strided = 7, SparseCoo = 1; c10: Strided = 0, Sparse = 1.
    match code {
        7 => Some(0),
        _ => None,
    }
}

fn c10_memory_format(code: i64) -> Option<i64> {
    // export: Contiguous 1, ChannelsLast 2, ChannelsLast3d 3, Preserve 4; c10: Contiguous 0,
    // Preserve 1, ChannelsLast 2, ChannelsLast3d 3.
    match code {
        1 => Some(0),
        2 => Some(2),
        3 => Some(3),
        4 => Some(1),
        _ => None,
    }
}

/// One argument as the bridge takes it; Err names what fact cannot pass on.
fn lower_arg(a: &NamedArgument) -> Result<ffi::ExportArg, String> {
    use ffi::ExportArgKind as K;
    let name = a.name.as_str();
    let mut out;
    match &a.arg {
        Argument::AsNone(_) => out = export_arg(name, K::None),
        Argument::AsTensor(t) => {
            out = export_arg(name, K::Tensor);
            out.names = vec![t.name.clone()];
        }
        Argument::AsOptionalTensor(t) => match t {
            schema::OptionalTensorArgument::AsTensor(t) => {
                out = export_arg(name, K::Tensor);
                out.names = vec![t.name.clone()];
            }
            schema::OptionalTensorArgument::AsNone(_) => out = export_arg(name, K::None),
        },
        Argument::AsTensors(ts) => {
            out = export_arg(name, K::Tensors);
            out.names = ts.iter().map(|t| t.name.clone()).collect();
        }
        Argument::AsOptionalTensors(ts) => {
            out = export_arg(name, K::OptionalTensors);
            out.names = ts
                .iter()
                .map(|t| match t {
                    schema::OptionalTensorArgument::AsTensor(t) => t.name.clone(),
                    schema::OptionalTensorArgument::AsNone(_) => String::new(),
                })
                .collect();
        }
        Argument::AsInt(i) => {
            out = export_arg(name, K::Int);
            out.ints = vec![*i];
        }
        Argument::AsSymInt(s) => match s {
            SymIntArgument::AsInt(i) => {
                out = export_arg(name, K::Int);
                out.ints = vec![*i];
            }
            SymIntArgument::AsName(n) => {
                out = export_arg(name, K::SymInt);
                out.names = vec![n.clone()];
            }
        },
        Argument::AsInts(v) => {
            out = export_arg(name, K::Ints);
            out.ints = v.clone();
            out.names = vec![String::new(); v.len()];
        }
        Argument::AsSymInts(v) => {
            out = export_arg(name, K::Ints);
            for s in v {
                match s {
                    SymIntArgument::AsInt(i) => {
                        out.ints.push(*i);
                        out.names.push(String::new());
                    }
                    SymIntArgument::AsName(n) => {
                        out.ints.push(0);
                        out.names.push(n.clone());
                    }
                }
            }
        }
        Argument::AsFloat(f) => {
            out = export_arg(name, K::Float);
            out.floats = vec![*f];
        }
        Argument::AsSymFloat(schema::SymFloatArgument::AsFloat(f)) => {
            out = export_arg(name, K::Float);
            out.floats = vec![*f];
        }
        Argument::AsFloats(v) => {
            out = export_arg(name, K::Floats);
            out.floats = v.clone();
        }
        Argument::AsBool(b) => {
            out = export_arg(name, K::Bool);
            out.bools = vec![*b];
        }
        Argument::AsSymBool(schema::SymBoolArgument::AsBool(b)) => {
            out = export_arg(name, K::Bool);
            out.bools = vec![*b];
        }
        Argument::AsBools(v) => {
            out = export_arg(name, K::Bools);
            out.bools = v.clone();
        }
        Argument::AsString(s) => {
            out = export_arg(name, K::Str);
            out.text = s.clone();
        }
        Argument::AsScalarType(code) => {
            out = export_arg(name, K::ScalarType);
            out.text = schema::dtype_name(*code)
                .ok_or_else(|| format!("dtype code {code} (argument {name})"))?
                .to_string();
        }
        Argument::AsLayout(code) => {
            out = export_arg(name, K::Layout);
            out.ints = vec![c10_layout(*code).ok_or_else(|| {
                format!("layout {code} (argument {name}): fact reads strided tensors")
            })?];
        }
        Argument::AsMemoryFormat(code) => {
            out = export_arg(name, K::MemoryFormat);
            out.ints = vec![c10_memory_format(*code)
                .ok_or_else(|| format!("memory format {code} (argument {name})"))?];
        }
        Argument::AsDevice(d) => {
            out = export_arg(name, K::Device);
            out.text = device_text(d);
        }
        other => return Err(format!("argument {name} ({})", other.what())),
    }
    Ok(out)
}

/// The module path of a node from export's `nn_module_stack`
/// (`L__self__m.transformer.h.0,m.transformer.h.0,<class>;...`), as TorchScript writes scopes
/// (`__module.m/__module.m.transformer/...`).
fn scope_of(meta: &BTreeMap<String, String>) -> String {
    let Some(stack) = meta.get("nn_module_stack") else {
        return String::new();
    };
    stack
        .split(';')
        .filter_map(|entry| entry.split(',').nth(1))
        .filter(|p| !p.is_empty())
        .map(|p| format!("__module.{p}"))
        .collect::<Vec<_>>()
        .join("/")
}

/// The program as the bridge builds a TorchScript module from it.
pub fn lower(path: &Path, p: &Program) -> Result<ffi::ExportProgram, ExportError> {
    let ps = path.display().to_string();
    let ep = &p.program;
    let g = &ep.graph_module.graph;
    let mut state = Vec::new();
    let mut inputs = Vec::new();
    for spec in &ep.graph_module.signature.input_specs {
        let (arg, fqn, parameter, constant) = match spec {
            InputSpec::UserInput { arg } => {
                match arg {
                    Argument::AsTensor(t) => inputs.push(t.name.clone()),
                    other => {
                        return Err(bad(&ps, format!("a forward input is {} (not a tensor): fact composes programs whose inputs are tensors; export with the other values fixed (as constants of the model)", other.what())))
                    }
                }
                continue;
            }
            InputSpec::Parameter { arg, parameter_name } => (arg, parameter_name, true, false),
            InputSpec::Buffer { arg, buffer_name } => (arg, buffer_name, false, false),
            InputSpec::TensorConstant { arg, tensor_constant_name } => (arg, tensor_constant_name, false, true),
            InputSpec::ConstantInput { name, .. } => {
                return Err(bad(&ps, format!("input {name} is a constant input, which fact does not read; export the model with the value inside it")))
            }
            InputSpec::Other => return Err(bad(&ps, "the program takes a custom object or token input, which fact does not read")),
        };
        // Non-persistent buffers and tensor constants live among the constants.
        let found = p
            .weights
            .config
            .get(fqn)
            .map(|m| ("data/weights/", m))
            .filter(|_| !constant)
            .or_else(|| p.constants.config.get(fqn).map(|m| ("data/constants/", m)))
            .or_else(|| p.weights.config.get(fqn).map(|m| ("data/weights/", m)));
        let Some((dir, meta)) = found else {
            return Err(bad(&ps, format!("{fqn} has no payload in the archive; save the program again with torch.export.save")));
        };
        if meta.use_pickle {
            return Err(bad(&ps, format!("{fqn} is pickled (a tensor subclass or custom object), which fact does not read")));
        }
        let tm = meta
            .tensor_meta
            .as_ref()
            .or_else(|| g.tensor_values.get(&arg.name))
            .ok_or_else(|| bad(&ps, format!("{fqn} has no tensor metadata")))?;
        state.push(ffi::ExportState {
            name: arg.name.clone(),
            attr: fqn.clone(),
            record: format!("{dir}{}", meta.path_name),
            dtype: schema::dtype_name(tm.dtype)
                .ok_or_else(|| {
                    bad(
                        &ps,
                        format!(
                            "{fqn} has dtype code {}, which fact does not read",
                            tm.dtype
                        ),
                    )
                })?
                .to_string(),
            sizes: schema::SymInt::hints(&tm.sizes)
                .ok_or_else(|| bad(&ps, format!("{fqn} has a symbolic size")))?,
            strides: schema::SymInt::hints(&tm.strides)
                .ok_or_else(|| bad(&ps, format!("{fqn} has a symbolic stride")))?,
            offset: tm
                .storage_offset
                .as_ref()
                .and_then(schema::SymInt::hint)
                .unwrap_or(0),
            parameter,
            constant,
        });
    }
    // Every value a node or the graph's outputs read.
    let read: std::collections::HashSet<String> = g
        .nodes
        .iter()
        .flat_map(|n| n.inputs.iter().flat_map(|a| arg_reads(&a.arg)))
        .chain(g.outputs.iter().flat_map(Argument::defined_names))
        .collect();
    let mut nodes = Vec::with_capacity(g.nodes.len());
    for n in &g.nodes {
        let (op, overload) = op_of(&n.target)
            .ok_or_else(|| bad(&ps, format!("the program calls {}, which fact cannot rebuild as a TorchScript op; it is not a pattern fact replaces either: export without it or tell us", n.target)))?;
        let mut args = Vec::with_capacity(n.inputs.len());
        for (i, a) in n.inputs.iter().enumerate() {
            let mut lowered = lower_arg(a).map_err(|what| {
                bad(
                    &ps,
                    format!("{} takes {what}, which fact cannot pass on", n.target),
                )
            })?;
            // Python's operators on sizes name no arguments: TorchScript's int ops call them a, b.
            if a.name.is_empty() && overload == "int" && op != "aten::size" {
                lowered.name = ["a", "b"].get(i).copied().unwrap_or("").to_string();
            }
            args.push(lowered);
        }
        let list_output = matches!(n.outputs.as_slice(), [Argument::AsTensors(_)]);
        let outputs: Vec<String> = if list_output {
            n.outputs[0].defined_names()
        } else {
            n.outputs
                .iter()
                .map(|o| o.defined_names().into_iter().next().unwrap_or_default())
                .collect()
        };
        let device_of = |v: &str| g.tensor_values.get(v).map(|m| device_text(&m.device));
        let (op, overload, args, outputs) = respell(op, overload, args, outputs, &read, &device_of);
        let (op, overload, args) = alias_as_slice(g, op, overload, args);
        let custom = crate::graph::is_custom_op(&op);
        let metas = if !custom {
            vec![]
        } else {
            // All or none: a node's outputs are matched to these by position.
            outputs
                .iter()
                .map(|o| tensor_meta(g, o))
                .collect::<Option<Vec<_>>>()
                .unwrap_or_default()
        };
        nodes.push(ffi::ExportNode {
            op,
            overload,
            args,
            outputs,
            list_output,
            scope: scope_of(&n.metadata),
            custom,
            metas,
        });
    }
    let mut outputs = Vec::new();
    for o in &ep.graph_module.signature.output_specs {
        if let OutputSpec::UserOutput { arg } = o {
            match arg {
                Argument::AsTensor(t) => outputs.push(t.name.clone()),
                other => {
                    return Err(bad(&ps, format!("an output of the program is {} (not a tensor): fact composes programs that return tensors; export a wrapper that returns them", other.what())))
                }
            }
        }
    }
    let sample = inputs
        .iter()
        .map(|i| tensor_meta(g, i))
        .collect::<Option<Vec<_>>>()
        .unwrap_or_default();
    Ok(ffi::ExportProgram {
        state,
        inputs,
        sample,
        nodes,
        outputs,
    })
}

/// Value `name`'s dtype, sizes and strides at their hints (None where the program has none).
fn tensor_meta(g: &schema::Graph, name: &str) -> Option<ffi::ExportTensorMeta> {
    let m = g.tensor_values.get(name)?;
    Some(ffi::ExportTensorMeta {
        dtype: schema::dtype_name(m.dtype)?.to_string(),
        sizes: schema::SymInt::hints(&m.sizes)?,
        strides: schema::SymInt::hints(&m.strides)?,
    })
}

/// Export's spellings that TorchScript writes as another op, read as a trace writes them, so the
/// rules read them as they read a trace:
/// - `to.dtype_layout` with a dtype is `to.dtype` (the layout strided, and the device none or
///   the one its tensor is on), and so is `_to_copy` with a dtype (run_decompositions' cast); a
///   move to another device (BEiT's and MPNet's positions, made on the CPU) keeps its spelling,
///   device and all;
/// - run_decompositions' `convolution` is `_convolution` with a trace's flags,
///   `native_layer_norm` and `_native_batch_norm_legit_no_training` whose statistics nothing reads
///   are `layer_norm` and `batch_norm` (eval), and `_softmax` without its half-to-float is
///   `softmax`.
fn respell(
    op: String,
    overload: String,
    mut args: Vec<ffi::ExportArg>,
    mut outputs: Vec<String>,
    read: &std::collections::HashSet<String>,
    device_of: &dyn Fn(&str) -> Option<String>,
) -> (String, String, Vec<ffi::ExportArg>, Vec<String>) {
    use ffi::ExportArgKind as K;
    let has = |args: &[ffi::ExportArg], name: &str, kind: K| {
        args.iter().any(|a| a.name == name && a.kind == kind)
    };
    let bool_arg = |name: &str, v: bool| {
        let mut a = export_arg(name, K::Bool);
        a.bools = vec![v];
        a
    };
    let only_first_read = outputs
        .iter()
        .skip(1)
        .all(|o| o.is_empty() || !read.contains(o));
    match (op.as_str(), overload.as_str()) {
        ("aten::to", "dtype_layout") | ("aten::_to_copy", "") => {
            let strided = args
                .iter()
                .all(|a| a.name != "layout" || a.kind == K::None || a.ints == [0]);
            let from = args
                .iter()
                .find(|a| a.name == "self" && a.kind == K::Tensor)
                .and_then(|a| a.names.first())
                .and_then(|v| device_of(v));
            let stays = args.iter().all(|a| {
                a.name != "device"
                    || a.kind == K::None
                    || from.as_deref().is_some_and(|f| same_device(f, &a.text))
            });
            if has(&args, "dtype", K::ScalarType) && strided && stays {
                let keep = ["self", "dtype", "non_blocking", "copy", "memory_format"];
                let args = args
                    .into_iter()
                    .filter(|a| keep.contains(&a.name.as_str()))
                    .collect();
                return ("aten::to".into(), "dtype".into(), args, outputs);
            }
        }
        ("aten::convolution", "") => {
            for (name, v) in [
                ("benchmark", false),
                ("deterministic", false),
                ("cudnn_enabled", true),
                ("allow_tf32", true),
            ] {
                args.push(bool_arg(name, v));
            }
            return ("aten::_convolution".into(), String::new(), args, outputs);
        }
        ("aten::native_layer_norm", "") if only_first_read => {
            args.push(bool_arg("cudnn_enable", true));
            outputs.truncate(1);
            return ("aten::layer_norm".into(), String::new(), args, outputs);
        }
        ("aten::_native_batch_norm_legit_no_training", "") if only_first_read => {
            args.push(bool_arg("training", false));
            args.push(bool_arg("cudnn_enabled", true));
            outputs.truncate(1);
            return ("aten::batch_norm".into(), String::new(), args, outputs);
        }
        ("aten::_softmax", "")
            if args
                .iter()
                .any(|a| a.name == "half_to_float" && a.bools == [false]) =>
        {
            let args = args
                .into_iter()
                .filter(|a| a.name != "half_to_float")
                .collect();
            return ("aten::softmax".into(), "int".into(), args, outputs);
        }
        _ => {}
    }
    (op, overload, args, outputs)
}

/// A device as torch::Device parses it ("cuda:0", "cpu").
fn device_text(d: &schema::Device) -> String {
    match d.index {
        Some(i) => format!("{}:{i}", d.kind),
        None => d.kind.clone(),
    }
}

/// Whether two devices' texts name one device (a type without an index is its current one).
fn same_device(a: &str, b: &str) -> bool {
    let (ak, ai) = a.split_once(':').map_or((a, None), |(k, i)| (k, Some(i)));
    let (bk, bi) = b.split_once(':').map_or((b, None), |(k, i)| (k, Some(i)));
    ak == bk && (ai.is_none() || bi.is_none() || ai == bi)
}

/// The values an argument reads.
fn arg_reads(a: &Argument) -> Vec<String> {
    match a {
        Argument::AsSymInts(v) => v
            .iter()
            .filter_map(|s| match s {
                SymIntArgument::AsName(n) => Some(n.clone()),
                SymIntArgument::AsInt(_) => None,
            })
            .collect(),
        Argument::AsOptionalTensors(v) => v
            .iter()
            .filter_map(|t| match t {
                schema::OptionalTensorArgument::AsTensor(t) => Some(t.name.clone()),
                schema::OptionalTensorArgument::AsNone(_) => None,
            })
            .collect(),
        other => other.defined_names(),
    }
}

/// export writes a slice over a whole dim (Phi-3's `q[..., :rotary_dim]` where the rotary dim is
/// the head's) as `alias`; a trace records the slice, which the rules read (the partial rotary
/// form's cut). An alias of a tensor of known rank reads as the slice of its whole last dim.
fn alias_as_slice(
    g: &schema::Graph,
    op: String,
    overload: String,
    args: Vec<ffi::ExportArg>,
) -> (String, String, Vec<ffi::ExportArg>) {
    if op != "aten::alias" || args.len() != 1 || args[0].kind != ffi::ExportArgKind::Tensor {
        return (op, overload, args);
    }
    let Some(meta) = g
        .tensor_values
        .get(&args[0].names[0])
        .filter(|m| !m.sizes.is_empty())
    else {
        return (op, overload, args);
    };
    let int = |name: &str, v: i64| {
        let mut a = export_arg(name, ffi::ExportArgKind::Int);
        a.ints = vec![v];
        a
    };
    let end = meta
        .sizes
        .last()
        .and_then(schema::SymInt::hint)
        .filter(|_| meta.sizes.last().is_some_and(|s| s.symbol().is_none()));
    let mut out = args;
    out[0].name = "self".into();
    out.push(int("dim", meta.sizes.len() as i64 - 1));
    out.push(int("start", 0));
    out.push(int("end", end.unwrap_or(i64::MAX)));
    out.push(int("step", 1));
    ("aten::slice".into(), "Tensor".into(), out)
}

/// The sample inputs' shapes and dtypes (the program's tensor metadata at their hints).
pub fn sample_shapes(p: &Program) -> Result<Vec<(Vec<i64>, String)>, String> {
    let g = &p.program.graph_module.graph;
    user_inputs(&p.program)
        .iter()
        .map(|name| {
            let meta = g
                .tensor_values
                .get(name)
                .ok_or_else(|| format!("input {name} has no tensor metadata"))?;
            let sizes = schema::SymInt::hints(&meta.sizes);
            let dtype = schema::dtype_name(meta.dtype)
                .ok_or_else(|| format!("input {name} has dtype code {}", meta.dtype))?;
            Ok((
                sizes.ok_or_else(|| format!("input {name} has a size without a hint"))?,
                dtype.to_string(),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_above_the_sample_reaches_past_it_and_a_bounded_one_at_it_does_not() {
        let dim = |max: Option<i64>| DynamicDim {
            input: 0,
            dim: 0,
            symbol: "s0".into(),
            min: Some(1),
            max,
            sample: 32,
        };
        assert!(dim(None).past_sample() && dim(Some(33)).past_sample());
        assert!(!dim(Some(32)).past_sample());
        assert_eq!(
            dim(None).describe(),
            "input 1 dim 0 (s0) in [1, inf), tuned at 32"
        );
    }

    #[test]
    fn targets_read_as_torchscript_ops() {
        assert_eq!(
            op_of("torch.ops.aten.addmm.default"),
            Some(("aten::addmm".into(), "".into()))
        );
        assert_eq!(
            op_of("torch.ops.aten.to.dtype_layout"),
            Some(("aten::to".into(), "dtype_layout".into()))
        );
        assert_eq!(
            op_of("torch.ops.aten.sym_size.int"),
            Some(("aten::size".into(), "int".into()))
        );
        assert_eq!(
            op_of("_operator.mul"),
            Some(("aten::mul".into(), "int".into()))
        );
        assert_eq!(op_of("builtins.getattr"), None);
    }

    #[test]
    fn a_cast_reads_as_to_dtype_unless_it_moves_its_tensor_to_another_device() {
        use ffi::ExportArgKind as K;
        let cast = |device: Option<&str>| {
            let mut x = export_arg("self", K::Tensor);
            x.names = vec!["pos".into()];
            let mut dtype = export_arg("dtype", K::ScalarType);
            dtype.text = "i64".into();
            let mut args = vec![x, dtype];
            if let Some(d) = device {
                let mut a = export_arg("device", K::Device);
                a.text = d.into();
                args.push(a);
            }
            respell(
                "aten::to".into(),
                "dtype_layout".into(),
                args,
                vec!["out".into()],
                &Default::default(),
                &|v: &str| (v == "pos").then(|| "cpu".to_string()),
            )
        };
        for same in [None, Some("cpu")] {
            let (op, overload, args, _) = cast(same);
            assert_eq!((op.as_str(), overload.as_str()), ("aten::to", "dtype"));
            assert!(args.iter().all(|a| a.name != "device"));
        }
        // MPNet's relative positions, made on the CPU and moved to the GPU: a trace's `to.dtype`
        // would leave them on the CPU.
        let (op, overload, args, _) = cast(Some("cuda:0"));
        assert_eq!(
            (op.as_str(), overload.as_str()),
            ("aten::to", "dtype_layout")
        );
        assert!(args
            .iter()
            .any(|a| a.name == "device" && a.text == "cuda:0"));
        assert!(same_device("cuda", "cuda:0") && same_device("cuda:1", "cuda:1"));
        assert!(!same_device("cuda:0", "cuda:1") && !same_device("cpu", "cuda"));
    }

    #[test]
    fn a_grad_switch_is_inlined_with_its_outputs_keeping_their_names() {
        let mut g: Json = serde_json::from_str(
            r#"{"inputs": [], "outputs": [{"as_tensor": {"name": "cos_1"}}], "tensor_values": {"x": {}}, "sym_int_values": {}, "nodes": [
              {"target": "torch.ops.aten._assert_tensor_metadata.default", "inputs": [], "outputs": []},
              {"target": "torch.ops.higher_order.wrap_with_set_grad_enabled", "inputs": [
                 {"name": "", "arg": {"as_bool": false}},
                 {"name": "", "arg": {"as_graph": {"name": "submod_1", "graph": {
                    "inputs": [{"as_tensor": {"name": "a"}}], "outputs": [{"as_tensor": {"name": "cos"}}],
                    "tensor_values": {"a": {}, "mul": {}, "cos": {}}, "sym_int_values": {},
                    "nodes": [
                      {"target": "torch.ops.aten.mul.Tensor", "inputs": [{"name": "self", "arg": {"as_tensor": {"name": "a"}}}, {"name": "other", "arg": {"as_float": 2.0}}], "outputs": [{"as_tensor": {"name": "mul"}}]},
                      {"target": "torch.ops.aten.cos.default", "inputs": [{"name": "self", "arg": {"as_tensor": {"name": "mul"}}}], "outputs": [{"as_tensor": {"name": "cos"}}]}]}}}},
                 {"name": "", "arg": {"as_tensor": {"name": "x"}}}],
               "outputs": [{"as_tensor": {"name": "cos_1"}}]}]}"#,
        )
        .unwrap();
        normalise_graph(&mut g, "m.pt2").unwrap();
        let nodes = g["nodes"].as_array().unwrap();
        assert_eq!(nodes.len(), 2, "the assertion dropped, the body inlined");
        assert_eq!(nodes[0]["inputs"][0]["arg"]["as_tensor"]["name"], "x");
        assert_eq!(nodes[0]["outputs"][0]["as_tensor"]["name"], "submod_1__mul");
        assert_eq!(
            nodes[1]["inputs"][0]["arg"]["as_tensor"]["name"],
            "submod_1__mul"
        );
        assert_eq!(nodes[1]["outputs"][0]["as_tensor"]["name"], "cos_1");
        assert!(g["tensor_values"].get("submod_1__mul").is_some());
        assert!(g["tensor_values"].get("cos_1").is_some());
    }

    #[test]
    fn autocast_on_inside_is_refused() {
        let node: Json = serde_json::from_str(
            r#"{"inputs": [{"arg": {"as_string": "cuda"}}, {"arg": {"as_none": true}}, {"arg": {"as_bool": true}}]}"#,
        )
        .unwrap();
        assert!(inlinable("torch.ops.higher_order.wrap_with_autocast", &node).is_err());
    }

    #[test]
    fn module_stacks_read_as_scopes() {
        let mut m = BTreeMap::new();
        m.insert(
            "nn_module_stack".to_string(),
            "L__self__,,__main__.W;L__self__m,m,x.GPT2LMHeadModel;L__self__m.transformer,m.transformer,x.GPT2Model".to_string(),
        );
        assert_eq!(scope_of(&m), "__module.m/__module.m.transformer");
    }
}
