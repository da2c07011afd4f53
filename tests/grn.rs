//! Global Response Normalization on the CPU: the zoo's ConvNeXt V2 with its GRNs rewritten to
//! `fact::grn` computes the model's output through the op's fallback.

use crate::common::{outputs_differ_by, zoo_fixtures};
use fact::torch;
use std::path::Path;
use tch::{Kind, Tensor};

/// The zoo's ConvNeXt V2 as traced, its four GRNs (Hugging Face's form) rewritten with kernel
/// "gr", which the library does not hold: every call falls back and the module computes what the
/// model does (within 1e-5), the graph's nine ops per block gone. Run by
/// `gemm_ep_falls_back_to_the_original_ops_on_cpu`, which holds this process's op library.
pub fn composed_grn_falls_back_exactly(library: &Path) {
    let dir = tempfile::tempdir().unwrap();
    torch::op_stats(library, true).unwrap();
    let model = zoo_fixtures().join("convnextv2.pt");
    let (g, _) = torch::load_graph(&model, &[]).unwrap();
    let found = fact::kinds::grn::match_grns(&g);
    assert_eq!(found.len(), 4);
    assert!(found
        .iter()
        .all(|m| m.form == fact::kinds::grn::Form::Hf && m.eps == 1e-6));
    let edits: Vec<_> = found
        .iter()
        .map(|m| fact::kinds::grn::edit(&g, m, "gr"))
        .collect();
    let out = dir.path().join("convnextv2.pt");
    let text = torch::rewrite_and_save(&model, &out, &edits, &fact::kinds::registry::op_schemas())
        .unwrap();
    assert_eq!(text.matches("fact::grn(").count(), 4, "{text}");
    assert!(!text.contains("aten::linalg_vector_norm"), "{text}");
    let image = Tensor::randn([2, 3, 224, 224], (Kind::Float, tch::Device::Cpu));
    let diff = outputs_differ_by(&model, &out, &[image]);
    assert!(diff <= 1e-5, "convnextv2: differs by {diff}");
    let calls = torch::op_stats(library, false).unwrap();
    assert_eq!(
        calls
            .get("gr")
            .map(|c| (c.ran, c.fell_back, c.why.as_deref())),
        Some((0, 4, Some("not CUDA tensors of one device"))),
        "{calls:?}"
    );
}
