//! The `.pt2` back end: writes a composed program from the same edits the TorchScript back end
//! makes. The bridge makes the edits in the module built from the program (`rewrite_export`, the
//! code rewrite_and_save runs) and returns the rewritten program node by node; here each node the
//! program had is copied from the archive's (normalised) JSON as it was, each call of a fact op is
//! written as export writes a custom op's call, and the buffers the calls read (padded,
//! interleaved, folded, concatenated weights) become buffers of the program with their bytes in
//! the archive, as do the values the forward computed from its state alone (`fold_static_values`
//! in memo.cc: a program has no memo), each under the name the value had. Everything else in the
//! archive (weights, constants, sample inputs, range constraints, the signature's other entries)
//! is kept. The archive is written whole (`atomic`):
//! a killed compose leaves the previous file or none, never a truncated one.

use super::super::ffi;
use super::{schema, Program};
use serde_json::{json, Value as Json};
use std::collections::HashMap;
use std::path::Path;

/// What the writer wrote: the calls and the buffers it added.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Written {
    pub calls: usize,
    pub buffers: usize,
    /// Bytes of the added buffers.
    pub buffer_bytes: u64,
}

/// Export's dtype code of one of fact's dtype names.
fn dtype_code(name: &str) -> Option<i64> {
    (0..32).find(|&c| schema::dtype_name(c) == Some(name))
}

/// One argument of a call as export's JSON writes it.
fn arg_json(a: &ffi::WrittenArg) -> Result<Json, String> {
    let tensor = |n: &String| json!({ "name": n });
    let arg = match a.kind.as_str() {
        "as_tensor" => json!({ "as_tensor": tensor(&a.names[0]) }),
        "as_tensors" => json!({ "as_tensors": a.names.iter().map(tensor).collect::<Vec<_>>() }),
        "as_int" => json!({ "as_int": a.ints[0] }),
        "as_ints" => json!({ "as_ints": a.ints }),
        "as_float" => json!({ "as_float": schema::float_json(a.number) }),
        "as_bool" => json!({ "as_bool": a.ints[0] != 0 }),
        "as_string" => json!({ "as_string": a.text }),
        "as_none" => json!({ "as_none": true }),
        other => return Err(format!("an argument of kind {other}")),
    };
    // Every argument of fact's schemas is positional (ArgumentKind.POSITIONAL).
    Ok(json!({ "name": a.name, "arg": arg, "kind": 1 }))
}

/// The names every node of `nodes` defines, each to its node's index.
fn defined_by(nodes: &[Json]) -> HashMap<String, usize> {
    let mut out = HashMap::new();
    for (i, n) in nodes.iter().enumerate() {
        let outputs: Vec<schema::Argument> =
            serde_json::from_value(n["outputs"].clone()).unwrap_or_default();
        for name in outputs.iter().flat_map(schema::Argument::defined_names) {
            out.insert(name, i);
        }
    }
    out
}

/// The tensor metadata of a buffer the writer adds, on the device of the program's weights.
fn buffer_meta(b: &ffi::WrittenBuffer, device: &Json) -> Result<Json, String> {
    let code =
        dtype_code(&b.dtype).ok_or_else(|| format!("buffer {} has dtype {}", b.attr, b.dtype))?;
    let mut strides = vec![1i64; b.sizes.len()];
    for d in (0..b.sizes.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * b.sizes[d + 1].max(1);
    }
    let ints = |v: &[i64]| {
        v.iter()
            .map(|&i| json!({ "as_int": i }))
            .collect::<Vec<_>>()
    };
    Ok(json!({
        "dtype": code,
        "sizes": ints(&b.sizes),
        "requires_grad": false,
        "device": device,
        "strides": ints(&strides),
        "storage_offset": { "as_int": 0 },
        "layout": 7,
    }))
}

/// Writes the program of the `.pt2` archive at `source` (read as `program`) with `rewritten`'s
/// calls to `out`, written whole.
pub fn write(
    source: &Path,
    program: &Program,
    rewritten: &ffi::ExportRewrite,
    out: &Path,
) -> Result<Written, String> {
    let src = source.display().to_string();
    let mut json = program.json.clone();
    let graph = &mut json["graph_module"]["graph"];
    let nodes = graph["nodes"].as_array().cloned().unwrap_or_default();
    let defined = defined_by(&nodes);
    let mut written: Vec<Json> = Vec::with_capacity(nodes.len());
    let mut copied = vec![false; nodes.len()];
    let mut calls = 0;
    for n in &rewritten.nodes {
        if !n.original.is_empty() {
            let i = *defined.get(&n.original).ok_or_else(|| {
                format!(
                    "the rewritten graph names {}, which no node of the program defines",
                    n.original
                )
            })?;
            if !copied[i] {
                copied[i] = true;
                written.push(nodes[i].clone());
            }
            continue;
        }
        let name =
            n.op.strip_prefix("fact::")
                .ok_or_else(|| format!("a call of {}, which is no fact op", n.op))?;
        let inputs = n
            .args
            .iter()
            .map(arg_json)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("fact::{name} takes {e}"))?;
        let outputs: Vec<Json> = n
            .outputs
            .iter()
            .map(|o| json!({ "as_tensor": { "name": o } }))
            .collect();
        // The call keeps the metadata (stack trace, module path) of the node whose output it
        // took over first.
        let metadata = n
            .outputs
            .first()
            .and_then(|o| defined.get(o))
            .map(|&i| nodes[i]["metadata"].clone())
            .unwrap_or_else(|| json!({}));
        // A node of one output is named by it, as export names nodes; one of several outputs
        // (each read through a getitem of that name on loading) gets a name of its own.
        let node_name = match n.outputs.as_slice() {
            [one] => one.clone(),
            _ => format!("fact_{name}_{calls}"),
        };
        written.push(json!({
            "target": format!("torch.ops.fact.{name}.default"),
            "inputs": inputs,
            "outputs": outputs,
            "metadata": metadata,
            "is_hop_single_tensor_return": null,
            "name": node_name,
        }));
        calls += 1;
    }
    graph["nodes"] = Json::Array(written);

    // The added buffers: placeholders after the program's parameters and buffers, as export
    // orders inputs, with metadata, a payload entry and their bytes.
    let specs = json["graph_module"]["signature"]["input_specs"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let at = specs
        .iter()
        .rposition(|s| s.get("parameter").is_some() || s.get("buffer").is_some())
        .map_or(0, |i| i + 1);
    let device = program
        .program
        .graph_module
        .graph
        .tensor_values
        .values()
        .next()
        .map(|m| json!({ "type": m.device.kind, "index": m.device.index }))
        .unwrap_or_else(|| json!({ "type": "cpu", "index": null }));
    let mut weights_config: Json = if program.weights.config.is_empty() {
        json!({ "config": {} })
    } else {
        let bytes = ffi::archive_record(&src, "data/weights/model_weights_config.json", usize::MAX)
            .map_err(|e| format!("cannot read the weights' config: {}", e.what()))?;
        serde_json::from_slice(&bytes)
            .map_err(|e| format!("the weights' config does not parse: {e}"))?
    };
    let mut records: Vec<ffi::ArchiveRecord> = Vec::new();
    let mut new_specs = Vec::new();
    let mut new_inputs = Vec::new();
    let mut buffer_bytes = 0u64;
    for (i, b) in rewritten.buffers.iter().enumerate() {
        // A folded value keeps the device the program computed it on; a weight takes the
        // weights'.
        let own = json["graph_module"]["graph"]["tensor_values"]
            .get(&b.name)
            .and_then(|m| m.get("device"))
            .cloned();
        let meta = buffer_meta(b, own.as_ref().unwrap_or(&device))?;
        let path_name = format!("weight_fact_{i}");
        json["graph_module"]["graph"]["tensor_values"][&b.name] = meta.clone();
        weights_config["config"][&b.attr] = json!({
            "path_name": path_name,
            "is_param": false,
            "use_pickle": false,
            "tensor_meta": meta,
        });
        new_specs.push(json!({ "buffer": { "arg": { "name": b.name }, "buffer_name": b.attr, "persistent": true } }));
        new_inputs.push(json!({ "as_tensor": { "name": b.name } }));
        buffer_bytes += b.data.len() as u64;
        records.push(ffi::ArchiveRecord {
            name: format!("data/weights/{path_name}"),
            data: b.data.clone(),
        });
    }
    let mut specs = specs;
    let mut inputs = json["graph_module"]["graph"]["inputs"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if inputs.len() != specs.len() {
        return Err(format!(
            "the program has {} inputs but {} input specs",
            inputs.len(),
            specs.len()
        ));
    }
    specs.splice(at..at, new_specs);
    inputs.splice(at..at, new_inputs);
    json["graph_module"]["signature"]["input_specs"] = Json::Array(specs);
    json["graph_module"]["graph"]["inputs"] = Json::Array(inputs);

    records.push(ffi::ArchiveRecord {
        name: program.record.clone(),
        data: serde_json::to_vec(&json).map_err(|e| e.to_string())?,
    });
    records.push(ffi::ArchiveRecord {
        name: "data/weights/model_weights_config.json".into(),
        data: serde_json::to_vec(&weights_config).map_err(|e| e.to_string())?,
    });
    let skip = vec![
        program.record.clone(),
        "data/weights/model_weights_config.json".to_string(),
    ];
    crate::atomic::write_with(
        out,
        |tmp| {
            ffi::write_archive(&src, &tmp.display().to_string(), &skip, &records)
                .map_err(|e| format!("cannot write {}: {}", out.display(), e.what()))
        },
        |e| format!("cannot write {}: {e}", out.display()),
    )?;
    Ok(Written {
        calls,
        buffers: rewritten.buffers.len(),
        buffer_bytes,
    })
}
