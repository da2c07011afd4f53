//! Reading and writing the nodes of a program's graph JSON: what the front end's rewrites
//! (mha.rs, heads_bmm.rs) share.

use super::{arg_names, reads, without_dead_nodes};
use serde_json::{json, Value as Json};
use std::collections::{HashMap, HashSet};

pub(super) fn target(n: &Json) -> &str {
    n["target"].as_str().unwrap_or_default()
}

pub(super) fn out_name(n: &Json) -> Option<&str> {
    n["outputs"][0]["as_tensor"]["name"].as_str()
}

/// The argument named `name` of node `n` (export writes the schema's names).
pub(super) fn arg<'a>(n: &'a Json, name: &str) -> Option<&'a Json> {
    n["inputs"]
        .as_array()?
        .iter()
        .find(|i| i["name"] == name)
        .map(|i| &i["arg"])
}

pub(super) fn tensor<'a>(n: &'a Json, name: &str) -> Option<&'a str> {
    arg(n, name)?["as_tensor"]["name"].as_str()
}

pub(super) fn int(n: &Json, name: &str) -> Option<i64> {
    arg(n, name)?["as_int"].as_i64()
}

/// An int list argument's numbers: `as_ints`, or `as_sym_ints` with each entry read by `get`
/// where it is a number (None where it is a symbol).
pub(super) fn ints(n: &Json, name: &str) -> Option<Vec<Option<i64>>> {
    let a = arg(n, name)?;
    if let Some(v) = a["as_ints"].as_array() {
        return Some(v.iter().map(Json::as_i64).collect());
    }
    let v = a["as_sym_ints"].as_array()?;
    Some(v.iter().map(|s| s["as_int"].as_i64()).collect())
}

/// The graph's nodes by the values they define, and how many times each value is read (by nodes
/// and by the graph's outputs).
pub(super) fn index(graph: &Json) -> (HashMap<String, usize>, HashMap<String, usize>) {
    let mut by_output = HashMap::new();
    let mut readers: HashMap<String, usize> = HashMap::new();
    for (i, n) in graph["nodes"].as_array().into_iter().flatten().enumerate() {
        for name in arg_names(&n["outputs"]) {
            by_output.insert(name, i);
        }
        let mut read = HashSet::new();
        reads(&n["inputs"], &mut read);
        for r in read {
            *readers.entry(r).or_default() += 1;
        }
    }
    for name in arg_names(&graph["outputs"]) {
        *readers.entry(name).or_default() += 1;
    }
    (by_output, readers)
}

/// The node of `op` whose first argument is `value`.
pub(super) fn node_reading<'a>(
    nodes: &'a [Json],
    value: &str,
    op: &str,
) -> Option<(usize, &'a Json)> {
    nodes.iter().enumerate().find(|(_, n)| {
        target(n) == op && n["inputs"][0]["arg"]["as_tensor"]["name"].as_str() == Some(value)
    })
}

pub(super) fn tensor_in(name: &str, value: &str) -> Json {
    json!({"name": name, "arg": {"as_tensor": {"name": value}}, "kind": 1})
}

pub(super) fn int_in(name: &str, v: i64) -> Json {
    json!({"name": name, "arg": {"as_int": v}, "kind": 1})
}

pub(super) fn call(op: &str, inputs: Vec<Json>, output: &str, metadata: &Json) -> Json {
    json!({
        "target": op,
        "inputs": inputs,
        "outputs": [{"as_tensor": {"name": output}}],
        "metadata": metadata,
        "is_hop_single_tensor_return": null,
        "name": output,
    })
}

/// Applies `apply` to what `find` finds in `graph` until it finds nothing more, one at a time
/// (each rewrite renumbers the nodes), then drops the nodes the rewrites left unread; returns how
/// many it applied.
pub(super) fn rewrite_all<F>(
    graph: &mut Json,
    find: impl Fn(&Json) -> Option<F>,
    apply: impl Fn(&mut Json, F),
) -> usize {
    let mut count = 0;
    while let Some(found) = find(graph) {
        apply(graph, found);
        count += 1;
    }
    if count > 0 {
        let nodes = graph["nodes"].as_array().cloned().unwrap_or_default();
        graph["nodes"] = Json::Array(without_dead_nodes(nodes, &graph["outputs"]));
    }
    count
}
