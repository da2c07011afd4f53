//! Attention written over [B·H, T, D] batches, as BLOOM writes it: q, k and v ([B,H,T,D] each)
//! reshaped to [B·H, T, D], the scores `baddbmm(bias, q3, k3ᵀ, beta=1, alpha)` (ALiBi as the
//! bias, [B·H, 1, Tk]) viewed back to [B,H,Tq,Tk], and after the softmax `bmm(p3, v3)` viewed
//! back to [B,H,Tq,D]. The rules read attention over [B,H,T,D] heads (a matmul, its scale, the
//! terms added to it), so each product is rewritten in that spelling, under the name its final
//! view had (every reader reads on):
//!
//! ```text
//! view(baddbmm(b3, reshape(q4), transpose(reshape(k4))), [B,H,Tq,-1])
//!     -> add(mul(matmul(q4, transpose(k4, 2, 3)), alpha), view(b3, [B,H,Tb,-1]))
//! view(bmm(view(p4, [B·H,Tq,-1]), reshape(v4)), [B,H,Tq,D])  ->  matmul(p4, v4)
//! ```
//!
//! Both sides compute the same function; the first rounds the scores after each of its three
//! ops where baddbmm rounds once. So the scores' rewrite is made only where fact's kernel can then
//! take the attention: beta 1 and a bias of q's dtype (the kernel adds the bias in that dtype).
//! Each rewrite needs every intermediate read by the chain alone and the sizes at the sample to
//! agree; anything else is left as exported.

use super::nodes::{arg, call, index, int_in, out_name, rewrite_all, target, tensor, tensor_in};
use serde_json::{json, Value as Json};

const VIEWS: [&str; 2] = [
    "torch.ops.aten.view.default",
    "torch.ops.aten.reshape.default",
];

/// Rewrites every [B·H]-batched attention product of `graph` (a program's graph JSON,
/// normalised); returns how many products.
pub(super) fn heads_bmm(graph: &mut Json) -> usize {
    rewrite_all(graph, find, apply)
}

enum Found {
    Scores {
        baddbmm: usize,
        view: usize,
        q4: String,
        k4: String,
        bias: String,
        alpha: f64,
        /// The final view's output, which the sum defines now.
        out: String,
        /// The final view's sizes (B and H as the program spells them, Tq).
        sizes: Vec<Json>,
    },
    Values {
        bmm: usize,
        view: usize,
        p4: String,
        v4: String,
        out: String,
    },
}

/// A number argument (`as_float` or `as_int`), `default` where absent.
fn number(n: &Json, name: &str, default: f64) -> Option<f64> {
    match arg(n, name) {
        None => Some(default),
        Some(a) => a["as_float"]
            .as_f64()
            .or_else(|| a["as_int"].as_i64().map(|i| i as f64)),
    }
}

fn find(graph: &Json) -> Option<Found> {
    let nodes = graph["nodes"].as_array()?;
    let values = &graph["tensor_values"];
    let (by_output, readers) = index(graph);
    let alone = |value: &str| readers.get(value).copied() == Some(1);
    let producer = |value: &str, ops: &[&str]| -> Option<&Json> {
        let n = &nodes[*by_output.get(value)?];
        ops.contains(&target(n)).then_some(n)
    };
    // The sizes of a value at the sample, and its dtype.
    let hints = |value: &str| -> Option<Vec<i64>> {
        values[value]["sizes"]
            .as_array()?
            .iter()
            .map(|s| {
                s["as_int"]
                    .as_i64()
                    .or_else(|| s["as_expr"]["hint"]["as_int"].as_i64())
            })
            .collect()
    };
    let dtype = |value: &str| values[value]["dtype"].as_i64();
    // `value` as a [B·H, ..] view of a [B,H,..] tensor read by that view alone: the tensor.
    let heads_of = |value: &str| -> Option<String> {
        let v = producer(value, &VIEWS).filter(|_| alone(value))?;
        let x = tensor(v, "self")?;
        let (xs, vs) = (hints(x)?, hints(value)?);
        (xs.len() == 4 && vs.len() == 3 && xs[0] * xs[1] == vs[0] && xs[2..] == vs[1..])
            .then(|| x.to_string())
    };
    // The view of `value` [B·H, a, b] back to `heads` [B,H] and [a,b] that alone reads it, H a
    // number: (its index, sizes). Row-major, so batch i of the value is head i % H of sequence
    // i / H of the view.
    let viewed_back = |value: &str, heads: &[i64]| -> Option<(usize, Vec<Json>)> {
        if !alone(value) {
            return None;
        }
        let (i, n) = nodes
            .iter()
            .enumerate()
            .find(|(_, n)| VIEWS.contains(&target(n)) && tensor(n, "self") == Some(value))?;
        let sizes = arg(n, "size")
            .or_else(|| arg(n, "shape"))
            .and_then(|a| a["as_sym_ints"].as_array().or(a["as_ints"].as_array()))?;
        let sizes: Vec<Json> = sizes
            .iter()
            .map(|s| {
                if s.is_i64() {
                    json!({"as_int": s})
                } else {
                    s.clone()
                }
            })
            .collect();
        let (from, to) = (hints(value)?, hints(out_name(n)?)?);
        let fits = sizes.len() == 4
            && to.len() == 4
            && to[..2] == heads[..2]
            && to[0] * to[1] == from[0]
            && to[2..] == from[1..]
            && sizes[1]["as_int"].as_i64() == Some(heads[1]);
        fits.then_some((i, sizes))
    };
    nodes.iter().enumerate().find_map(|(i, n)| match target(n) {
        "torch.ops.aten.baddbmm.default" => {
            if number(n, "beta", 1.0)? != 1.0 {
                return None;
            }
            let alpha = number(n, "alpha", 1.0)?;
            let q4 = heads_of(tensor(n, "batch1")?)?;
            let kt = tensor(n, "batch2")?;
            let t = producer(kt, &["torch.ops.aten.transpose.int"]).filter(|_| alone(kt))?;
            let dims = (
                arg(t, "dim0")?["as_int"].as_i64()?.rem_euclid(3),
                arg(t, "dim1")?["as_int"].as_i64()?.rem_euclid(3),
            );
            if dims != (1, 2) && dims != (2, 1) {
                return None;
            }
            let k4 = heads_of(tensor(t, "self")?)?;
            let bias = tensor(n, "self")?;
            let s3 = out_name(n)?;
            let (q, k, b, s) = (hints(&q4)?, hints(&k4)?, hints(bias)?, hints(s3)?);
            let (view, sizes) = viewed_back(s3, &q)?;
            let fits = q[..2] == k[..2]
                && q[3] == k[3]
                && b.len() == 3
                && b[0] == s[0]
                && (b[1] == 1 || b[1] == s[1])
                && b[2] == s[2]
                && dtype(bias) == dtype(&q4);
            fits.then(|| Found::Scores {
                baddbmm: i,
                view,
                q4,
                k4,
                bias: bias.to_string(),
                alpha,
                out: out_name(&nodes[view]).unwrap_or_default().to_string(),
                sizes,
            })
        }
        "torch.ops.aten.bmm.default" => {
            let p3 = tensor(n, "self")?;
            let v4 = heads_of(tensor(n, "mat2")?)?;
            let p4 = heads_of(p3)?;
            let (p, v) = (hints(&p4)?, hints(&v4)?);
            let (view, _) = viewed_back(out_name(n)?, &p)?;
            (p[..2] == v[..2] && p[3] == v[2]).then(|| Found::Values {
                bmm: i,
                view,
                p4,
                v4,
                out: out_name(&nodes[view]).unwrap_or_default().to_string(),
            })
        }
        _ => None,
    })
}

/// `x` times `h` as a size or stride of the program's metadata.
fn times(x: &Json, h: i64) -> Json {
    if let Some(i) = x["as_int"].as_i64() {
        return json!({"as_int": i * h});
    }
    let e = &x["as_expr"];
    let mut out = json!({"as_expr": {
        "expr_str": format!("Mul(Integer({h}), {})", e["expr_str"].as_str().unwrap_or_default()),
    }});
    if let Some(hint) = e["hint"]["as_int"].as_i64() {
        out["as_expr"]["hint"] = json!({"as_int": hint * h});
    }
    out
}

fn apply(graph: &mut Json, found: Found) {
    let nodes = graph["nodes"].as_array().cloned().unwrap_or_default();
    let values = graph["tensor_values"].clone();
    let (at, view, new_nodes, new_values) = match found {
        Found::Scores {
            baddbmm,
            view,
            q4,
            k4,
            bias,
            alpha,
            out,
            sizes,
        } => {
            let metadata = nodes[baddbmm]["metadata"].clone();
            let (kt, qk, scaled, b4) = (
                format!("{out}_kt"),
                format!("{out}_qk"),
                format!("{out}_scaled"),
                format!("{out}_bias"),
            );
            let mut kt_meta = values[&k4].clone();
            for key in ["sizes", "strides"] {
                if let Some(v) = kt_meta[key].as_array_mut() {
                    v.swap(2, 3);
                }
            }
            // The bias [B·H, Tb, Tk] split into [B, H, Tb, Tk]: B's stride is H of B·H's.
            let scores = &values[&out];
            let h = sizes[1]["as_int"].as_i64().unwrap_or(1);
            let mut b4_meta = values[&bias].clone();
            let (bs, bt) = (
                b4_meta["sizes"].as_array().cloned().unwrap_or_default(),
                b4_meta["strides"].as_array().cloned().unwrap_or_default(),
            );
            if bs.len() == 3 && bt.len() == 3 {
                b4_meta["sizes"] = json!([scores["sizes"][0], scores["sizes"][1], bs[1], bs[2]]);
                b4_meta["strides"] = json!([times(&bt[0], h), bt[0], bt[1], bt[2]]);
            }
            let tb = if values[&bias]["sizes"][1]["as_int"].as_i64() == Some(1) {
                json!({"as_int": 1})
            } else {
                sizes[2].clone()
            };
            let mut calls = vec![
                call(
                    "torch.ops.aten.transpose.int",
                    vec![tensor_in("self", &k4), int_in("dim0", 2), int_in("dim1", 3)],
                    &kt,
                    &metadata,
                ),
                call(
                    "torch.ops.aten.matmul.default",
                    vec![tensor_in("self", &q4), tensor_in("other", &kt)],
                    &qk,
                    &metadata,
                ),
            ];
            let mut product = qk.clone();
            let mut new_values = vec![(kt, kt_meta), (qk, scores.clone()), (b4.clone(), b4_meta)];
            if alpha != 1.0 {
                calls.push(call(
                    "torch.ops.aten.mul.Tensor",
                    vec![
                        tensor_in("self", &product),
                        json!({"name": "other", "arg": {"as_float": alpha}, "kind": 1}),
                    ],
                    &scaled,
                    &metadata,
                ));
                new_values.push((scaled.clone(), scores.clone()));
                product = scaled;
            }
            calls.push(call(
                "torch.ops.aten.view.default",
                vec![
                    tensor_in("self", &bias),
                    json!({"name": "size", "arg": {"as_sym_ints": [sizes[0], sizes[1], tb, {"as_int": -1}]}, "kind": 1}),
                ],
                &b4,
                &metadata,
            ));
            calls.push(call(
                "torch.ops.aten.add.Tensor",
                vec![tensor_in("self", &product), tensor_in("other", &b4)],
                &out,
                &metadata,
            ));
            (baddbmm, view, calls, new_values)
        }
        Found::Values {
            bmm,
            view,
            p4,
            v4,
            out,
        } => {
            let metadata = nodes[bmm]["metadata"].clone();
            let calls = vec![call(
                "torch.ops.aten.matmul.default",
                vec![tensor_in("self", &p4), tensor_in("other", &v4)],
                &out,
                &metadata,
            )];
            (bmm, view, calls, vec![])
        }
    };
    let mut out = Vec::with_capacity(nodes.len() + new_nodes.len());
    let mut new_nodes = Some(new_nodes);
    for (i, node) in nodes.into_iter().enumerate() {
        if i == at {
            // The product's inputs are all defined before it; its old nodes die unread.
            out.extend(new_nodes.take().unwrap_or_default());
            out.push(node);
        } else if i != view {
            out.push(node);
        }
    }
    graph["nodes"] = Json::Array(out);
    for (k, v) in new_values {
        graph["tensor_values"][k] = v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value's metadata: dtype code and sizes, contiguous strides.
    fn meta(dtype: i64, sizes: &[i64]) -> Json {
        let mut strides = vec![1; sizes.len()];
        for d in (0..sizes.len().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * sizes[d + 1];
        }
        json!({
            "dtype": dtype,
            "sizes": sizes.iter().map(|s| json!({"as_int": s})).collect::<Vec<_>>(),
            "strides": strides.iter().map(|s| json!({"as_int": s})).collect::<Vec<_>>(),
            "storage_offset": {"as_int": 0},
            "device": {"type": "cpu"},
            "layout": 7,
        })
    }

    fn ints_in(name: &str, v: &[i64]) -> Json {
        json!({"name": name, "arg": {"as_sym_ints": v.iter().map(|i| json!({"as_int": i})).collect::<Vec<_>>()}, "kind": 1})
    }

    /// BLOOM's attention at B 2, H 4, T 8, D 16 over q, k, v [B,H,T,D] and an ALiBi bias
    /// [B·H, 1, T] of dtype `bias_dtype` (q's: 7, float32), its output viewed back as `back`.
    fn bloom(bias_dtype: i64, back: [i64; 4]) -> Json {
        let m = Json::Null;
        let nodes = vec![
            call(
                "torch.ops.aten.reshape.default",
                vec![tensor_in("self", "q"), ints_in("shape", &[8, -1, 16])],
                "q3",
                &m,
            ),
            call(
                "torch.ops.aten.reshape.default",
                vec![tensor_in("self", "k"), ints_in("shape", &[8, -1, 16])],
                "k3",
                &m,
            ),
            call(
                "torch.ops.aten.transpose.int",
                vec![
                    tensor_in("self", "k3"),
                    int_in("dim0", -1),
                    int_in("dim1", -2),
                ],
                "kt3",
                &m,
            ),
            call(
                "torch.ops.aten.reshape.default",
                vec![tensor_in("self", "v"), ints_in("shape", &[8, -1, 16])],
                "v3",
                &m,
            ),
            call(
                "torch.ops.aten.baddbmm.default",
                vec![
                    tensor_in("self", "alibi"),
                    tensor_in("batch1", "q3"),
                    tensor_in("batch2", "kt3"),
                    json!({"name": "beta", "arg": {"as_float": 1.0}, "kind": 2}),
                    json!({"name": "alpha", "arg": {"as_float": 0.25}, "kind": 2}),
                ],
                "s3",
                &m,
            ),
            call(
                "torch.ops.aten.view.default",
                vec![tensor_in("self", "s3"), ints_in("size", &[2, 4, 8, -1])],
                "s4",
                &m,
            ),
            call(
                "torch.ops.aten.softmax.int",
                vec![tensor_in("self", "s4"), int_in("dim", -1)],
                "p4",
                &m,
            ),
            call(
                "torch.ops.aten.view.default",
                vec![tensor_in("self", "p4"), ints_in("size", &[8, 8, -1])],
                "p3",
                &m,
            ),
            call(
                "torch.ops.aten.bmm.default",
                vec![tensor_in("self", "p3"), tensor_in("mat2", "v3")],
                "o3",
                &m,
            ),
            call(
                "torch.ops.aten.view.default",
                vec![tensor_in("self", "o3"), ints_in("size", &back)],
                "o4",
                &m,
            ),
        ];
        let values = json!({
            "q": meta(7, &[2, 4, 8, 16]), "k": meta(7, &[2, 4, 8, 16]), "v": meta(7, &[2, 4, 8, 16]),
            "alibi": meta(bias_dtype, &[8, 1, 8]),
            "q3": meta(7, &[8, 8, 16]), "k3": meta(7, &[8, 8, 16]), "kt3": meta(7, &[8, 16, 8]),
            "v3": meta(7, &[8, 8, 16]), "s3": meta(7, &[8, 8, 8]), "s4": meta(7, &[2, 4, 8, 8]),
            "p4": meta(7, &[2, 4, 8, 8]), "p3": meta(7, &[8, 8, 8]), "o3": meta(7, &[8, 8, 16]),
            "o4": meta(7, &back),
        });
        json!({"nodes": nodes, "tensor_values": values, "outputs": [{"as_tensor": {"name": "o4"}}]})
    }

    fn targets(g: &Json) -> Vec<(String, String)> {
        g["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| {
                (
                    target(n).trim_start_matches("torch.ops.aten.").to_string(),
                    out_name(n).unwrap().to_string(),
                )
            })
            .collect()
    }

    #[test]
    fn both_products_read_over_heads_under_their_views_names() {
        let mut g = bloom(7, [2, 4, 8, 16]);
        assert_eq!(heads_bmm(&mut g), 2);
        let t = targets(&g);
        let has = |op: &str, out: &str| t.contains(&(op.to_string(), out.to_string()));
        assert!(
            has("add.Tensor", "s4") && has("matmul.default", "o4"),
            "{t:?}"
        );
        assert!(
            has("mul.Tensor", "s4_scaled") && has("view.default", "s4_bias"),
            "{t:?}"
        );
        assert!(
            !t.iter()
                .any(|(op, _)| op.starts_with("baddbmm") || op.starts_with("bmm")),
            "{t:?}"
        );
        // The bias [B·H, 1, T] as [B, H, 1, T]: B's stride is H rows of B·H's.
        let b = &g["tensor_values"]["s4_bias"];
        let ints = |k: &str| -> Vec<i64> {
            b[k].as_array()
                .unwrap()
                .iter()
                .map(|s| s["as_int"].as_i64().unwrap())
                .collect()
        };
        assert_eq!(
            (ints("sizes"), ints("strides")),
            (vec![2, 4, 1, 8], vec![32, 8, 8, 1])
        );
        // k's last two dims swapped for kᵀ.
        let kt = &g["tensor_values"]["s4_kt"]["strides"];
        assert_eq!(
            (kt[2]["as_int"].as_i64(), kt[3]["as_int"].as_i64()),
            (Some(1), Some(16))
        );
    }

    #[test]
    fn a_bias_of_another_dtype_keeps_the_scores_as_written() {
        // float16 ALiBi with float32 q: the kernel could not add it, so baddbmm's one rounding stays.
        let mut g = bloom(5, [2, 4, 8, 16]);
        assert_eq!(heads_bmm(&mut g), 1);
        let t = targets(&g);
        assert!(t.iter().any(|(op, _)| op.starts_with("baddbmm")), "{t:?}");
    }

    #[test]
    fn an_output_viewed_back_heads_first_is_left_alone() {
        // [H, B, T, D] is B·H split the other way: not the heads of p and v.
        let mut g = bloom(7, [4, 2, 8, 16]);
        assert_eq!(heads_bmm(&mut g), 1);
        let t = targets(&g);
        assert!(t.iter().any(|(op, _)| op.starts_with("bmm")), "{t:?}");
    }

    #[test]
    fn a_symbolic_stride_times_heads_keeps_its_hint() {
        let s = json!({"as_expr": {"expr_str": "Symbol('s70', positive=True, integer=True)", "hint": {"as_int": 64}}});
        let t = times(&s, 4);
        assert_eq!(
            t["as_expr"]["expr_str"],
            "Mul(Integer(4), Symbol('s70', positive=True, integer=True))"
        );
        assert_eq!(t["as_expr"]["hint"]["as_int"], 256);
        assert_eq!(times(&json!({"as_int": 3}), 4), json!({"as_int": 12}));
    }
}
