//! `nn.MultiheadAttention` with `batch_first=True` (torchvision's ViT) as export spells it:
//! `F.multi_head_attention_forward` works sequence-first, so the program transposes the input to
//! [T,B,E], projects it, splits q, k and v through a `contiguous` copy, views each as [B,H,T,D],
//! and after SDPA permutes back to [T,B,E] rows for the out-projection and transposes that to
//! [B,T,E]. A trace instead keeps the op whole (`_native_multi_head_attention`), which the bridge
//! rewrites batch-first (bridge.cc: `decompose_native_mha_node`). The two differ where it
//! matters: in export's spelling the out-projection's rows are in (T, B) order, so the residual
//! add after it reads a transposed operand no GEMM epilogue can take, and the q/k/v split is a
//! copy. Rewritten here in the trace's order, so both formats give the rules one graph: the
//! in-projection of the input itself, q, k and v as head views of its output
//! (`unflatten`, `select`, `transpose`), SDPA, its output's heads merged (`transpose`,
//! `flatten`), and the out-projection giving [B,T,E] under the name the transpose had.
//!
//! Only the exact chain is rewritten: self-attention (one input for q, k and v), no mask, no
//! dropout, every intermediate read by the chain alone, and a sequence length and width that are
//! numbers (the new values' strides then are too; a dynamic batch is kept as the program spells
//! it). Anything else is left as exported.

use super::nodes::{
    arg, call, index, int, int_in, ints, node_reading, out_name, rewrite_all, target, tensor,
    tensor_in,
};
use serde_json::{json, Value as Json};

/// Rewrites every batch-first self-attention of `graph` (a program's graph JSON, normalised);
/// returns how many.
pub(super) fn batch_first_mha(graph: &mut Json) -> usize {
    rewrite_all(graph, find, apply)
}

/// One attention's chain: the nodes it rewrites and the values it reads.
struct Found {
    /// The in-projection (`linear` of the transposed input) and the out-projection.
    in_proj: usize,
    out_proj: usize,
    sdpa: usize,
    /// The node defining the [B,T,E] result (the last transpose), removed.
    result_node: usize,
    x: String,
    w_in: Json,
    b_in: Json,
    w_out: Json,
    b_out: Json,
    result: String,
    heads: i64,
    head_dim: i64,
}

fn find(graph: &Json) -> Option<Found> {
    let nodes = graph["nodes"].as_array()?;
    let (by_output, readers) = index(graph);
    let node = |value: &str, op: &str| -> Option<(usize, &Json)> {
        let i = *by_output.get(value)?;
        (target(&nodes[i]) == op).then_some((i, &nodes[i]))
    };
    let alone = |value: &str| readers.get(value).copied() == Some(1);
    nodes.iter().enumerate().find_map(|(sdpa, s)| {
        if target(s) != "torch.ops.aten.scaled_dot_product_attention.default" {
            return None;
        }
        // No mask, no dropout, not causal, the default scale: what the module asks for without
        // a mask in eval.
        let defaults = s["inputs"]
            .as_array()?
            .iter()
            .all(|i| match i["name"].as_str() {
                Some("query" | "key" | "value") => true,
                Some("attn_mask" | "scale") => i["arg"].get("as_none").is_some(),
                Some("dropout_p") => i["arg"]["as_float"].as_f64() == Some(0.0),
                Some("is_causal" | "enable_gqa") => i["arg"]["as_bool"] == false,
                _ => false,
            });
        if !defaults {
            return None;
        }
        // q, k and v: view [B,H,T,D] <- transpose(0, 1) <- view [T,B*H,D] <- select(0, i) of
        // one split.
        let mut split = None;
        let (mut heads, mut head_dim) = (0, 0);
        for (i, name) in ["query", "key", "value"].iter().enumerate() {
            let v = tensor(s, name)?;
            let (_, bhtd) = node(v, "torch.ops.aten.view.default").filter(|_| alone(v))?;
            let sizes = ints(bhtd, "size")?;
            let [_, Some(h), _, Some(d)] = sizes.as_slice() else {
                return None;
            };
            (heads, head_dim) = (*h, *d);
            let v = tensor(bhtd, "self")?;
            let (_, t) = node(v, "torch.ops.aten.transpose.int").filter(|_| alone(v))?;
            if (int(t, "dim0")?, int(t, "dim1")?) != (0, 1) {
                return None;
            }
            let v = tensor(t, "self")?;
            let (_, tbd) = node(v, "torch.ops.aten.view.default").filter(|_| alone(v))?;
            let v = tensor(tbd, "self")?;
            let (_, sel) = node(v, "torch.ops.aten.select.int").filter(|_| alone(v))?;
            if (int(sel, "dim")?, int(sel, "index")?) != (0, i as i64) {
                return None;
            }
            let c = tensor(sel, "self")?;
            if split.is_some_and(|p| p != c) {
                return None;
            }
            split = Some(c);
        }
        let c = split?;
        if readers.get(c).copied() != Some(3) {
            return None;
        }
        // The split: contiguous <- squeeze(-2) <- transpose(0, -2) <- unsqueeze(0) <-
        // unflatten(-1, [3, E]) <- linear(transpose(x, 1, 0), w_in, b_in).
        let (_, contiguous) = node(c, "torch.ops.aten.contiguous.default")?;
        let v = tensor(contiguous, "self")?;
        let (_, squeeze) = node(v, "torch.ops.aten.squeeze.dim").filter(|_| alone(v))?;
        let v = tensor(squeeze, "self")?;
        let (_, t) = node(v, "torch.ops.aten.transpose.int").filter(|_| alone(v))?;
        if (int(squeeze, "dim")?, int(t, "dim0")?, int(t, "dim1")?) != (-2, 0, -2) {
            return None;
        }
        let v = tensor(t, "self")?;
        let (_, unsq) = node(v, "torch.ops.aten.unsqueeze.default").filter(|_| alone(v))?;
        let v = tensor(unsq, "self")?;
        let (_, unflat) = node(v, "torch.ops.aten.unflatten.int").filter(|_| alone(v))?;
        let e = heads * head_dim;
        if int(unsq, "dim")? != 0
            || int(unflat, "dim")? != -1
            || ints(unflat, "sizes")? != [Some(3), Some(e)]
        {
            return None;
        }
        let v = tensor(unflat, "self")?;
        let (in_proj, lin) = node(v, "torch.ops.aten.linear.default").filter(|_| alone(v))?;
        let xt = tensor(lin, "input")?;
        let (_, xt_node) = node(xt, "torch.ops.aten.transpose.int")?;
        if (int(xt_node, "dim0")?, int(xt_node, "dim1")?) != (1, 0) {
            return None;
        }
        let x = tensor(xt_node, "self")?;
        // [B,T,E] with T and E numbers.
        let sizes = graph["tensor_values"][x]["sizes"].as_array()?;
        let [_, t_len, e_len] = sizes.as_slice() else {
            return None;
        };
        if t_len["as_int"].as_i64().is_none() || e_len["as_int"].as_i64() != Some(e) {
            return None;
        }
        // After SDPA: permute [2,0,1,3] -> view [T*B,E] -> linear(w_out, b_out) -> view [T,B,E]
        // -> transpose(1, 0).
        let y = out_name(s)?;
        let (_, perm) =
            node_reading(nodes, y, "torch.ops.aten.permute.default").filter(|_| alone(y))?;
        if ints(perm, "dims")? != [Some(2), Some(0), Some(1), Some(3)] {
            return None;
        }
        let v = out_name(perm)?;
        let (_, rows) =
            node_reading(nodes, v, "torch.ops.aten.view.default").filter(|_| alone(v))?;
        let v = out_name(rows)?;
        let (out_proj, lout) =
            node_reading(nodes, v, "torch.ops.aten.linear.default").filter(|_| alone(v))?;
        if tensor(lout, "input")? != v {
            return None;
        }
        let v = out_name(lout)?;
        let (_, tbe) =
            node_reading(nodes, v, "torch.ops.aten.view.default").filter(|_| alone(v))?;
        let v = out_name(tbe)?;
        let (result_node, back) =
            node_reading(nodes, v, "torch.ops.aten.transpose.int").filter(|_| alone(v))?;
        if (int(back, "dim0")?, int(back, "dim1")?) != (1, 0) {
            return None;
        }
        let weight = |n: &Json, name: &str| arg(n, name).cloned();
        Some(Found {
            in_proj,
            out_proj,
            sdpa,
            result_node,
            x: x.to_string(),
            w_in: weight(lin, "weight")?,
            b_in: weight(lin, "bias")?,
            w_out: weight(lout, "weight")?,
            b_out: weight(lout, "bias")?,
            result: out_name(back)?.to_string(),
            heads,
            head_dim,
        })
    })
}

fn apply(graph: &mut Json, f: Found) {
    let (h, d) = (f.heads, f.head_dim);
    let e = h * d;
    let nodes = graph["nodes"].as_array().cloned().unwrap_or_default();
    let values = &graph["tensor_values"];
    let x_sizes = values[&f.x]["sizes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let (batch, t) = (
        x_sizes[0].clone(),
        x_sizes[1]["as_int"].as_i64().unwrap_or(0),
    );
    // dtype, device and layout as the in-projection's output had them.
    let like = values[out_name(&nodes[f.in_proj]).unwrap_or_default()].clone();
    let meta = |sizes: Vec<Json>, strides: &[i64], offset: i64| {
        let mut v = like.clone();
        v["sizes"] = Json::Array(sizes);
        v["strides"] = strides.iter().map(|s| json!({"as_int": s})).collect();
        v["storage_offset"] = json!({"as_int": offset});
        v
    };
    let n = |v: i64| json!({"as_int": v});
    let y = out_name(&nodes[f.sdpa]).unwrap_or_default().to_string();
    let y_meta = values[&y].clone();
    let base = out_name(&nodes[f.in_proj]).unwrap_or_default().to_string();
    let proj = format!("{base}_bt");
    let split = format!("{base}_bt_heads");
    let mut new_values: Vec<(String, Json)> = vec![
        (
            proj.clone(),
            meta(
                vec![batch.clone(), n(t), n(3 * e)],
                &[t * 3 * e, 3 * e, 1],
                0,
            ),
        ),
        (
            split.clone(),
            meta(
                vec![batch.clone(), n(t), n(3), n(h), n(d)],
                &[t * 3 * e, 3 * e, e, d, 1],
                0,
            ),
        ),
    ];
    let in_meta = nodes[f.in_proj]["metadata"].clone();
    let mut before = vec![
        call(
            "torch.ops.aten.linear.default",
            vec![
                tensor_in("input", &f.x),
                json!({"name": "weight", "arg": f.w_in, "kind": 1}),
                json!({"name": "bias", "arg": f.b_in, "kind": 1}),
            ],
            &proj,
            &in_meta,
        ),
        call(
            "torch.ops.aten.unflatten.int",
            vec![
                tensor_in("self", &proj),
                int_in("dim", -1),
                json!({"name": "sizes", "arg": {"as_ints": [3, h, d]}, "kind": 1}),
            ],
            &split,
            &in_meta,
        ),
    ];
    let mut qkv = Vec::new();
    for i in 0..3 {
        let one = format!("{base}_bt_{i}");
        let heads_first = format!("{base}_bt_{i}_heads");
        before.push(call(
            "torch.ops.aten.select.int",
            vec![
                tensor_in("self", &split),
                int_in("dim", 2),
                int_in("index", i),
            ],
            &one,
            &in_meta,
        ));
        before.push(call(
            "torch.ops.aten.transpose.int",
            vec![
                tensor_in("self", &one),
                int_in("dim0", 1),
                int_in("dim1", 2),
            ],
            &heads_first,
            &in_meta,
        ));
        new_values.push((
            one,
            meta(
                vec![batch.clone(), n(t), n(h), n(d)],
                &[t * 3 * e, 3 * e, d, 1],
                i * e,
            ),
        ));
        new_values.push((
            heads_first.clone(),
            meta(
                vec![batch.clone(), n(h), n(t), n(d)],
                &[t * 3 * e, d, 3 * e, 1],
                i * e,
            ),
        ));
        qkv.push(heads_first);
    }
    // SDPA's output [B,H,T,D], its heads merged back into rows of [B,T,E].
    let rows = format!("{y}_bt");
    let merged = format!("{y}_bt_merged");
    let out_meta = nodes[f.out_proj]["metadata"].clone();
    let mut rows_meta = y_meta.clone();
    for key in ["sizes", "strides"] {
        if let Some(v) = rows_meta[key].as_array_mut() {
            if v.len() == 4 {
                v.swap(1, 2);
            }
        }
    }
    new_values.push((rows.clone(), rows_meta));
    let contiguous = || meta(vec![batch.clone(), n(t), n(e)], &[t * e, e, 1], 0);
    new_values.push((merged.clone(), contiguous()));
    new_values.push((f.result.clone(), contiguous()));
    let after = [
        call(
            "torch.ops.aten.transpose.int",
            vec![tensor_in("self", &y), int_in("dim0", 1), int_in("dim1", 2)],
            &rows,
            &out_meta,
        ),
        call(
            "torch.ops.aten.flatten.using_ints",
            vec![
                tensor_in("self", &rows),
                int_in("start_dim", 2),
                int_in("end_dim", -1),
            ],
            &merged,
            &out_meta,
        ),
        call(
            "torch.ops.aten.linear.default",
            vec![
                tensor_in("input", &merged),
                json!({"name": "weight", "arg": f.w_out, "kind": 1}),
                json!({"name": "bias", "arg": f.b_out, "kind": 1}),
            ],
            &f.result,
            &out_meta,
        ),
    ];
    let mut out = Vec::with_capacity(nodes.len() + 10);
    for (i, mut node) in nodes.into_iter().enumerate() {
        if i == f.in_proj {
            out.append(&mut before);
        } else if i == f.out_proj {
            out.extend(after.iter().cloned());
        } else if i == f.result_node {
            // The out-projection defines its name now.
        } else {
            if i == f.sdpa {
                for (input, name) in node["inputs"]
                    .as_array_mut()
                    .into_iter()
                    .flatten()
                    .filter(|a| matches!(a["name"].as_str(), Some("query" | "key" | "value")))
                    .zip(&qkv)
                {
                    input["arg"] = json!({"as_tensor": {"name": name}});
                }
            }
            out.push(node);
        }
    }
    graph["nodes"] = Json::Array(out);
    for (k, v) in new_values {
        graph["tensor_values"][k] = v;
    }
}
