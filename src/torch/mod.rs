//! The boundary to libtorch: the cxx bridge that reads and rewrites TorchScript graphs, shape
//! propagation from example inputs, and the process-wide CUDA set-up (libtorch_cuda, op libraries).
//! All C++ lives behind this module; nothing above it sees a C++ type.

use crate::atomic;
use crate::graph::{Const, Edit, Graph, MaskClass, MaskFact, Node, OperandKind, TensorInfo, Value};
use archive::ArchiveKind;
use std::path::Path;
use std::sync::{Mutex, OnceLock};
use thiserror::Error;

pub mod archive;
pub mod export;

#[cxx::bridge(namespace = "fact::bridge")]
mod ffi {
    struct InputSpec {
        shape: Vec<i64>,
        dtype: String,
    }
    struct ValueInfo {
        name: String,
        ty: String,
        has_shape: bool,
        shape: Vec<i64>,
        strides: Vec<i64>,
        dtype: String,
        /// The class of an SDPA mask's value (graph::MaskClass's names), empty for other values.
        mask: String,
        /// Whether that mask's producers read only the inputs' sizes (with constants and module
        /// state), not their data.
        mask_shape_only: bool,
    }
    struct NodeInfo {
        kind: String,
        inputs: Vec<u32>,
        outputs: Vec<u32>,
        constant: String,
        depth: u32,
        scope: String,
        /// The composed module's memo computes it once per shape (memo.cc, `memo_static_nodes`).
        memo: bool,
    }
    /// The node torch could not run on the inputs (empty `kind` when every node ran).
    struct OpFailure {
        kind: String,
        scope: String,
        /// Each input as `4x63:f32` (tensors) or its value.
        inputs: Vec<String>,
        /// The first line of torch's message.
        message: String,
    }
    struct GraphDump {
        values: Vec<ValueInfo>,
        nodes: Vec<NodeInfo>,
        inputs: Vec<u32>,
        outputs: Vec<u32>,
        note: String,
        failure: OpFailure,
    }
    /// `graph::OperandKind` as the bridge reads it (bridge.cc): the same variants in the same
    /// order.
    enum OperandKind {
        Value,
        Str,
        Int,
        None,
        Values,
        Padded,
        Interleaved,
        Folded,
        Concatenated,
    }
    /// `graph::Operand` as the bridge reads it.
    struct Operand {
        kind: OperandKind,
        value: u32,
        text: String,
        int_value: i64,
        values: Vec<u32>,
    }
    /// `graph::Edit` as the bridge reads it.
    struct Edit {
        node: u32,
        expect_kind: String,
        op: String,
        operands: Vec<Operand>,
        remove: Vec<u32>,
        remove_kinds: Vec<String>,
        outputs: Vec<u32>,
        output_kinds: Vec<String>,
        first: bool,
    }
    /// How an argument of an exported node is given (export/mod.rs `lower`).
    enum ExportArgKind {
        None,
        /// The value `names[0]`.
        Tensor,
        /// A Tensor[] of the values `names`.
        Tensors,
        /// A Tensor?[]: `names`, "" for None.
        OptionalTensors,
        Int,
        /// Ints of which those with a name in `names` are symbolic values (the others `ints`).
        Ints,
        /// The symbolic int value `names[0]`.
        SymInt,
        Float,
        Floats,
        Bool,
        Bools,
        Str,
        /// The dtype `text` (fact's names).
        ScalarType,
        /// c10's code in `ints[0]`.
        Layout,
        MemoryFormat,
        /// `text`, as torch::Device parses it.
        Device,
    }
    /// One argument of an exported node, named as its op's schema names it (empty for a
    /// positional one export left unnamed).
    struct ExportArg {
        name: String,
        kind: ExportArgKind,
        names: Vec<String>,
        ints: Vec<i64>,
        floats: Vec<f64>,
        bools: Vec<bool>,
        text: String,
    }
    /// A node of an exported program as TorchScript writes it: op `aten::addmm`, overload ""
    /// for the default; `outputs` the names it defines ("" for one nothing reads); a node whose
    /// one output is a Tensor[] the program unpacks has `list_output`, `outputs` its elements.
    struct ExportNode {
        op: String,
        overload: String,
        args: Vec<ExportArg>,
        outputs: Vec<String>,
        list_output: bool,
        scope: String,
        /// A call of an op outside torch's and fact's namespaces (`graph::is_custom_op`: a custom
        /// op a Python library registers, which this libtorch may not hold).
        custom: bool,
        /// For a custom op, each output's metadata at the sample, so shapes go on past it (empty
        /// where the program holds none, and for torch's ops).
        metas: Vec<ExportTensorMeta>,
    }
    /// A tensor's dtype (fact's names), sizes and strides at the program's sample.
    struct ExportTensorMeta {
        dtype: String,
        sizes: Vec<i64>,
        strides: Vec<i64>,
    }
    /// A parameter, buffer or constant of an exported program: its placeholder's name, its
    /// fully qualified name, the archive record with its bytes and how to read them.
    struct ExportState {
        name: String,
        attr: String,
        record: String,
        dtype: String,
        sizes: Vec<i64>,
        strides: Vec<i64>,
        offset: i64,
        parameter: bool,
        /// A tensor constant of the program (a Python number or `torch.tensor(..)` the model's
        /// code made): one of at most one element is a constant of the graph, as tracing
        /// records it.
        constant: bool,
    }
    struct ExportProgram {
        state: Vec<ExportState>,
        inputs: Vec<String>,
        /// The inputs' metadata at the sample (empty where one has none).
        sample: Vec<ExportTensorMeta>,
        nodes: Vec<ExportNode>,
        outputs: Vec<String>,
    }
    /// An argument of a call in a rewritten program (`rewrite_export`): `kind` is the key export's
    /// JSON gives the union (`as_tensor`, `as_tensors`, `as_int`, `as_ints`, `as_float`,
    /// `as_bool`, `as_string`, `as_none`), its payload in the field of its type.
    struct WrittenArg {
        name: String,
        kind: String,
        names: Vec<String>,
        ints: Vec<i64>,
        number: f64,
        text: String,
    }
    /// A node of a rewritten program, in program order: `original` names a value the program's
    /// own node defines (that node stays as the archive wrote it), else it is a call of `op`
    /// whose outputs take over the names in `outputs`.
    struct WrittenNode {
        original: String,
        op: String,
        args: Vec<WrittenArg>,
        outputs: Vec<String>,
    }
    /// A buffer the rewrite made (a padded, interleaved, folded or concatenated weight): its
    /// placeholder's name, its attribute name, and its bytes, packed row-major.
    struct WrittenBuffer {
        name: String,
        attr: String,
        dtype: String,
        sizes: Vec<i64>,
        data: Vec<u8>,
    }
    struct ExportRewrite {
        nodes: Vec<WrittenNode>,
        buffers: Vec<WrittenBuffer>,
    }
    /// A record of an archive `write_archive` writes.
    struct ArchiveRecord {
        name: String,
        data: Vec<u8>,
    }
    unsafe extern "C++" {
        include!("fact/src/torch/bridge.h");
        fn traced_inputs(path: &str) -> Result<Vec<InputSpec>>;
        fn load_graph(path: &str, inputs: &Vec<InputSpec>) -> Result<GraphDump>;
        fn rewrite_and_save(
            path: &str,
            out_path: &str,
            edits: &Vec<Edit>,
            schemas: &Vec<String>,
        ) -> Result<String>;
        fn graph_text(path: &str) -> Result<String>;
        fn save_fp64_copy(path: &str, out_path: &str) -> Result<()>;
        fn archive_records(path: &str) -> Result<Vec<String>>;
        fn archive_record(path: &str, name: &str, limit: usize) -> Result<Vec<u8>>;
        fn set_float32_matmul_precision(mode: &str) -> Result<()>;
        fn float32_matmul_precision() -> String;
        fn torch_version() -> String;
        fn register_export(path: &str, program: &ExportProgram) -> Result<()>;
        fn rewrite_export(
            path: &str,
            edits: &Vec<Edit>,
            schemas: &Vec<String>,
        ) -> Result<ExportRewrite>;
        fn write_archive(
            source: &str,
            out_path: &str,
            skip: &Vec<String>,
            add: &Vec<ArchiveRecord>,
        ) -> Result<()>;
        fn save_module(path: &str, out_path: &str) -> Result<()>;
    }
}

pub use ffi::InputSpec;

#[derive(Debug, Error)]
pub enum TorchError {
    #[error("cannot read {path}: {detail}")]
    Read { path: String, detail: String },
    #[error("cannot write {path}: {detail}")]
    Write { path: String, detail: String },
    #[error("{path}: this is not a TorchScript module: {what}; export the model and save it with torch.export.save(torch.export.export(model.eval(), example_inputs), \"model.pt2\"), or trace it and save it with torch.jit.trace(model.eval(), example_inputs).save(path)")]
    NotTorchScript { path: String, what: String },
    #[error("{path}: no example inputs stored in the archive; pass the shapes with --input, e.g. --input 4096x4096:f32 (once per forward input)")]
    MissingShapes { path: String },
    #[error("{path}: input {index} ({shape}) has a zero-size dimension: nothing can be tuned on an empty tensor; pass the shape of a real batch with --input (every dimension at least 1)")]
    ZeroSize {
        path: String,
        index: usize,
        shape: String,
    },
    #[error("{0}")]
    OpFailed(Box<OpFailure>),
    #[error("{0}")]
    Bridge(String),
    /// A `.pt2` archive fact cannot read; the message names the fix.
    #[error("{0}")]
    Export(String),
    #[error("cannot load op library {path}: {detail}")]
    OpLibrary { path: String, detail: String },
}

/// An op torch could not run while shapes were interpreted from `--input` shapes (boxed in
/// `TorchError`, which stays small for the results that carry it): the inputs may be wrong, or
/// the op may need more than sizes, and the message says both.
#[derive(Debug)]
pub struct OpFailure {
    pub path: String,
    pub given: String,
    pub op: String,
    pub scope: String,
    pub op_inputs: String,
    pub message: String,
}

impl std::fmt::Display for OpFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: shape propagation stops at {op}{} on inputs {}: {op} got {} and torch says \"{}\"; either these inputs are not ones the model's forward takes (pass --input shapes the model's forward accepts, once per forward input), or {op} needs more than sizes to run (fact runs each op on meta tensors, then CPU empties, then CPU zeros): that is fact's limit, not your input, and without --input (the archive's own traced inputs) discover goes on past it with the shapes after it unknown",
            self.path, self.scope, self.given, self.op_inputs, self.message, op = self.op
        )
    }
}

/// fact's schemas are defined where missing, by rewrite_and_save or by an op library's static
/// initialisers; a check and its definition must not interleave with another thread's.
static SCHEMAS: Mutex<()> = Mutex::new(());

/// Shape and dtype of one forward input, from the archive's traced inputs or `--input`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct InputShape {
    pub shape: Vec<i64>,
    pub dtype: String,
}

impl InputShape {
    /// Parses `4096x4096:f32` (dtype defaults to f32).
    pub fn parse(s: &str) -> Result<InputShape, String> {
        let (dims, dtype) = s.split_once(':').unwrap_or((s, "f32"));
        let shape: Result<Vec<i64>, _> = dims.split('x').map(|d| d.trim().parse::<i64>()).collect();
        let shape = shape.map_err(|_| {
            format!("bad --input '{s}': write dims joined by x, e.g. 4096x4096:f32")
        })?;
        if shape.iter().any(|&d| d < 0) {
            return Err(format!("bad --input '{s}': dims must not be negative"));
        }
        if !["f32", "bf16", "f16", "f64", "i64", "i32", "bool"].contains(&dtype) {
            return Err(format!("bad --input '{s}': dtype '{dtype}' is not one of f32, bf16, f16, f64, i64, i32, bool"));
        }
        Ok(InputShape {
            shape,
            dtype: dtype.to_string(),
        })
    }
    pub fn display(&self) -> String {
        let dims: Vec<String> = self.shape.iter().map(|d| d.to_string()).collect();
        format!("{}:{}", dims.join("x"), self.dtype)
    }
}

/// Checks that `path` is a TorchScript archive, and says what it is when it is not.
fn check_archive(path: &Path) -> Result<String, TorchError> {
    use std::io::Read;
    let p = path.display().to_string();
    let read_err = |e: std::io::Error| TorchError::Read {
        path: p.clone(),
        detail: e.to_string(),
    };
    let mut head = Vec::with_capacity(4);
    std::fs::File::open(path)
        .map_err(read_err)?
        .take(4)
        .read_to_end(&mut head)
        .map_err(read_err)?;
    let not_ts = |kind: ArchiveKind| TorchError::NotTorchScript {
        path: p.clone(),
        what: kind.describe(),
    };
    if let Some(kind) = archive::from_head(&head) {
        return Err(not_ts(kind));
    }
    let records = ffi::archive_records(&p).map_err(|e| TorchError::NotTorchScript {
        path: p.clone(),
        what: format!(
            "it is a zip archive torch cannot read ({})",
            first_line(e.what())
        ),
    })?;
    // A state dict's first tensor comes early in its pickle; 64 KiB tells what it holds.
    match archive::from_records(&records, || {
        ffi::archive_record(&p, "data.pkl", 1 << 16).unwrap_or_default()
    }) {
        ArchiveKind::TorchScript => Ok(p),
        ArchiveKind::ExportedProgram => {
            exported(path, &records)?;
            Ok(p)
        }
        kind => Err(not_ts(kind)),
    }
}

/// The `.pt2` programs read in this process, by path: read and registered with the bridge once.
static EXPORTED: Mutex<Vec<(std::path::PathBuf, std::sync::Arc<export::Program>)>> =
    Mutex::new(Vec::new());

/// The program of the `.pt2` archive at `path` (whose records are `records`), read and
/// registered with the bridge on first use, so that every entry point loads its module.
fn exported(
    path: &Path,
    records: &[String],
) -> Result<std::sync::Arc<export::Program>, TorchError> {
    let mut all = EXPORTED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, p)) = all.iter().find(|(p, _)| p == path) {
        return Ok(p.clone());
    }
    let program = export::read(path, records).map_err(|e| TorchError::Export(e.to_string()))?;
    let lowered = export::lower(path, &program).map_err(|e| TorchError::Export(e.to_string()))?;
    let p = path.display().to_string();
    ffi::register_export(&p, &lowered).map_err(|e| {
        TorchError::Export(format!(
            "{p}: fact cannot rebuild this program as a graph: {}",
            first_line(e.what())
        ))
    })?;
    let program = std::sync::Arc::new(program);
    all.push((path.to_path_buf(), program.clone()));
    Ok(program)
}

/// The program of a `.pt2` archive, read (and registered) on first use; None for a TorchScript
/// archive.
pub fn export_program(path: &Path) -> Result<Option<std::sync::Arc<export::Program>>, TorchError> {
    check_archive(path)?;
    let all = EXPORTED.lock().unwrap_or_else(|e| e.into_inner());
    Ok(all.iter().find(|(p, _)| p == path).map(|(_, p)| p.clone()))
}

fn bridge_err(path: &str, e: cxx::Exception) -> TorchError {
    let msg = e.what().to_string();
    if msg.contains("PytorchStreamReader") {
        TorchError::NotTorchScript {
            path: path.to_string(),
            what: format!("torch cannot read it ({})", first_line(&msg)),
        }
    } else {
        TorchError::Bridge(first_line(&msg))
    }
}

fn first_line(s: &str) -> String {
    s.lines()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
        .trim()
        .to_string()
}

/// The example inputs a traced archive carries (empty when it carries none).
pub fn traced_inputs(path: &Path) -> Result<Vec<InputShape>, TorchError> {
    let p = check_archive(path)?;
    if let Some(program) = export_program(path)? {
        // The program's own sample inputs, at the hints of its symbolic sizes.
        let shapes =
            export::sample_shapes(&program).map_err(|e| TorchError::Export(format!("{p}: {e}")))?;
        return Ok(shapes
            .into_iter()
            .map(|(shape, dtype)| InputShape { shape, dtype })
            .collect());
    }
    let specs = ffi::traced_inputs(&p).map_err(|e| bridge_err(&p, e))?;
    Ok(specs
        .into_iter()
        .map(|s| InputShape {
            shape: s.shape,
            dtype: s.dtype,
        })
        .collect())
}

/// Loads `forward` of a TorchScript archive, inlined, with every tensor's shape and dtype from one
/// run on the given inputs (or the traced ones when `inputs` is empty).
///
/// An op that no interpretation runs (meta tensors, CPU empties, CPU zeros) fails the load when
/// the inputs are the user's (they may be wrong); on the archive's own traced inputs, which ran
/// the model when it was traced, it is fact's limit: the graph's note names the op and its
/// outputs and everything computed from them stay without shapes (`stopped_note`).
pub fn load_graph(
    path: &Path,
    inputs: &[InputShape],
) -> Result<(Graph, Vec<InputShape>), TorchError> {
    let p = check_archive(path)?;
    let traced = inputs.is_empty();
    let inputs = if traced {
        let traced = traced_inputs(path)?;
        if traced.is_empty() {
            return Err(TorchError::MissingShapes { path: p });
        }
        traced
    } else {
        inputs.to_vec()
    };
    if let Some((i, input)) = inputs
        .iter()
        .enumerate()
        .find(|(_, i)| i.shape.contains(&0))
    {
        return Err(TorchError::ZeroSize {
            path: p,
            index: i + 1,
            shape: input.display(),
        });
    }
    let specs: Vec<InputSpec> = inputs
        .iter()
        .map(|i| InputSpec {
            shape: i.shape.clone(),
            dtype: i.dtype.clone(),
        })
        .collect();
    let mut dump = ffi::load_graph(&p, &specs).map_err(|e| bridge_err(&p, e))?;
    if !dump.failure.kind.is_empty() && traced {
        dump.note = format!("{}{}", stopped_note(&dump.failure), dump.note);
    } else if !dump.failure.kind.is_empty() {
        let f = &dump.failure;
        let given: Vec<String> = inputs.iter().map(InputShape::display).collect();
        return Err(TorchError::OpFailed(Box::new(OpFailure {
            path: p,
            given: given.join(", "),
            op: f.kind.clone(),
            scope: if f.scope.is_empty() {
                String::new()
            } else {
                format!(" (in {})", f.scope)
            },
            op_inputs: f.inputs.join(", "),
            message: f.message.clone(),
        })));
    }
    Ok((graph_from_dump(dump), inputs))
}

/// The note a graph carries when an op stopped shape propagation on the archive's traced inputs.
fn stopped_note(f: &ffi::OpFailure) -> String {
    let scope = if f.scope.is_empty() {
        String::new()
    } else {
        format!(" (in {})", f.scope)
    };
    format!(
        "shape propagation stopped at {}{scope}: fact could not run it for shapes on meta tensors, CPU empties or CPU zeros (it got {}; torch says \"{}\"); the inputs are the archive's own traced ones, so this is fact's limit, not the model's input: its outputs and everything computed from them have no shapes, and no pattern there is matched; ",
        f.kind,
        f.inputs.join(", "),
        f.message
    )
}

fn graph_from_dump(d: ffi::GraphDump) -> Graph {
    let mut values: Vec<Value> = d
        .values
        .into_iter()
        .map(|v| Value {
            name: v.name,
            ty: v.ty,
            tensor: v.has_shape.then_some(TensorInfo {
                dtype: v.dtype,
                shape: v.shape,
                strides: v.strides,
            }),
            producer: None,
            mask: MaskClass::parse(&v.mask).map(|class| MaskFact {
                class,
                shape_only: v.mask_shape_only,
            }),
        })
        .collect();
    let nodes: Vec<Node> = d
        .nodes
        .into_iter()
        .enumerate()
        .map(|(i, n)| {
            for &o in &n.outputs {
                values[o as usize].producer = Some(i);
            }
            Node {
                constant: (n.kind == "prim::Constant").then(|| Const::parse(&n.constant)),
                kind: n.kind,
                inputs: n.inputs.iter().map(|&v| v as usize).collect(),
                outputs: n.outputs.iter().map(|&v| v as usize).collect(),
                depth: n.depth,
                scope: n.scope,
                memo: n.memo,
            }
        })
        .collect();
    Graph {
        values,
        nodes,
        inputs: d.inputs.iter().map(|&v| v as usize).collect(),
        outputs: d.outputs.iter().map(|&v| v as usize).collect(),
        note: d.note,
    }
}

/// Replaces nodes (or patterns of nodes) of `forward` by custom-op calls and saves the module
/// to `out` whole (`atomic`); returns the new graph's text. `schemas` are the ops' schemas (every kind's, `kinds::registry::
/// op_schemas`), defined first where missing.
/// The edits as the bridge takes them (cxx passes a Vec it owns).
fn ffi_edits(edits: &[Edit]) -> Vec<ffi::Edit> {
    edits
        .iter()
        .map(|e| ffi::Edit {
            node: e.node,
            expect_kind: e.expect_kind.clone(),
            op: e.op.clone(),
            operands: e
                .operands
                .iter()
                .map(|o| ffi::Operand {
                    kind: match o.kind {
                        OperandKind::Value => ffi::OperandKind::Value,
                        OperandKind::Str => ffi::OperandKind::Str,
                        OperandKind::Int => ffi::OperandKind::Int,
                        OperandKind::None => ffi::OperandKind::None,
                        OperandKind::Values => ffi::OperandKind::Values,
                        OperandKind::Padded => ffi::OperandKind::Padded,
                        OperandKind::Interleaved => ffi::OperandKind::Interleaved,
                        OperandKind::Folded => ffi::OperandKind::Folded,
                        OperandKind::Concatenated => ffi::OperandKind::Concatenated,
                    },
                    value: o.value,
                    text: o.text.clone(),
                    int_value: o.int_value,
                    values: o.values.clone(),
                })
                .collect(),
            remove: e.remove.clone(),
            remove_kinds: e.remove_kinds.clone(),
            outputs: e.outputs.clone(),
            output_kinds: e.output_kinds.clone(),
            first: e.first,
        })
        .collect()
}

pub fn rewrite_and_save(
    path: &Path,
    out: &Path,
    edits: &[Edit],
    schemas: &[&str],
) -> Result<String, TorchError> {
    let p = check_archive(path)?;
    let edits = ffi_edits(edits);
    let schemas: Vec<String> = schemas.iter().map(|s| s.to_string()).collect();
    let _schemas = SCHEMAS.lock().unwrap_or_else(|e| e.into_inner());
    atomic::write_with(
        out,
        |tmp| {
            ffi::rewrite_and_save(&p, &tmp.display().to_string(), &edits, &schemas)
                .map_err(|e| TorchError::Bridge(first_line(e.what())))
        },
        write_err(out),
    )
}

/// Makes the same edits as `rewrite_and_save` in the program of the `.pt2` archive at `path` and
/// writes the composed program to `out` (a `.pt2` archive, written whole or not at all).
pub fn rewrite_and_write_pt2(
    path: &Path,
    out: &Path,
    edits: &[Edit],
    schemas: &[&str],
) -> Result<export::write::Written, TorchError> {
    let p = check_archive(path)?;
    let Some(program) = export_program(path)? else {
        return Err(TorchError::Export(format!(
            "{p}: a .pt2 program is written from a .pt2 archive only (this is a TorchScript module, which has no export graph): export the model with torch.export.export and save it with torch.export.save, then compose that"
        )));
    };
    let edits = ffi_edits(edits);
    let schemas: Vec<String> = schemas.iter().map(|s| s.to_string()).collect();
    let rewritten = {
        let _schemas = SCHEMAS.lock().unwrap_or_else(|e| e.into_inner());
        ffi::rewrite_export(&p, &edits, &schemas)
            .map_err(|e| TorchError::Bridge(first_line(e.what())))?
    };
    export::write::write(path, &program, &rewritten, out)
        .map_err(|e| TorchError::Export(format!("{p}: {e}")))
}

/// What read a model: its format and, for a `.pt2` program, the dynamic dims of its inputs.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FrontEnd {
    /// `torchscript` or `pt2`.
    pub format: String,
    /// A `.pt2` program's dialect: `TRAINING` (the IR torch.export.export returns) or `ATEN`
    /// (after `run_decompositions()`), as its verifiers name it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub dialect: String,
    /// Each dynamic dim, described (`export::DynamicDim::describe`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dynamic: Vec<String>,
    /// Whether a dynamic dim's range reaches past the sample's size: calls there run kernels
    /// tuned at the sample's, whose tiles may fill the GPU's waves there and not past it
    /// (export.md, "Dynamic dims").
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub past_sample: bool,
}

impl FrontEnd {
    pub fn of(path: &Path) -> Result<FrontEnd, TorchError> {
        Ok(match export_program(path)? {
            Some(p) => FrontEnd {
                format: "pt2".into(),
                dialect: p.json["verifiers"]
                    .as_array()
                    .and_then(|v| v.first())
                    .and_then(|v| v.as_str())
                    .unwrap_or("TRAINING")
                    .to_string(),
                dynamic: p.dynamic.iter().map(export::DynamicDim::describe).collect(),
                past_sample: p.dynamic.iter().any(export::DynamicDim::past_sample),
            },
            None => FrontEnd {
                format: "torchscript".into(),
                dialect: String::new(),
                dynamic: vec![],
                past_sample: false,
            },
        })
    }
    pub fn is_pt2(&self) -> bool {
        self.format == "pt2"
    }
}

/// Saves the module at `path` (a `.pt2` archive's as fact reads it) as a TorchScript archive.
pub fn save_torchscript(path: &Path, out: &Path) -> Result<(), TorchError> {
    let p = check_archive(path)?;
    ffi::save_module(&p, &out.display().to_string())
        .map_err(|e| TorchError::Bridge(first_line(e.what())))
}

/// The inlined `forward` graph of an archive as TorchScript prints it.
pub fn graph_text(path: &Path) -> Result<String, TorchError> {
    let p = check_archive(path)?;
    ffi::graph_text(&p).map_err(|e| bridge_err(&p, e))
}

/// Saves the module at `path` with its floating parameters and buffers in fp64 (the rest as it is)
/// to `out` (whole): the reference a bench verifies against.
pub fn save_fp64_copy(path: &Path, out: &Path) -> Result<(), TorchError> {
    let p = check_archive(path)?;
    atomic::write_with(
        out,
        |tmp| ffi::save_fp64_copy(&p, &tmp.display().to_string()).map_err(|e| bridge_err(&p, e)),
        write_err(out),
    )
}

fn write_err(path: &Path) -> impl FnOnce(std::io::Error) -> TorchError + '_ {
    move |e| TorchError::Write {
        path: path.display().to_string(),
        detail: e.to_string(),
    }
}

/// Sets torch.set_float32_matmul_precision for this process ("highest", "high", "medium").
pub fn set_float32_matmul_precision(mode: &str) -> Result<(), TorchError> {
    ffi::set_float32_matmul_precision(mode).map_err(|e| TorchError::Bridge(e.what().to_string()))
}

/// The libtorch version this process runs, e.g. "2.11.0".
pub fn torch_version() -> String {
    ffi::torch_version()
}

pub fn float32_matmul_precision() -> String {
    ffi::float32_matmul_precision()
}

/// Makes CUDA usable from tch: rustc links with --as-needed, which drops libtorch_cuda, so it is
/// opened by hand before the first CUDA call. Returns whether a CUDA device is usable.
pub fn cuda_available() -> bool {
    static CUDA: OnceLock<bool> = OnceLock::new();
    *CUDA.get_or_init(|| {
        // SAFETY: libtorch_cuda's initialisers only register CUDA kernels and hooks with the
        // libtorch already loaded in this process; the handle is leaked so they stay registered.
        let loaded =
            unsafe { libloading::os::unix::Library::open(Some("libtorch_cuda.so"), libc_flags()) };
        match loaded {
            Ok(lib) => {
                std::mem::forget(lib);
                tch::Cuda::is_available()
            }
            Err(_) => false,
        }
    })
}

fn libc_flags() -> i32 {
    libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL
}

/// Loads a fact op library (registers fact::gemm and fact::gemm_ep with torch) for the rest of the process. A process
/// holds at most one: torch allows one TORCH_LIBRARY(fact) registration.
pub fn load_op_library(path: &Path) -> Result<(), TorchError> {
    static LOADED: OnceLock<std::path::PathBuf> = OnceLock::new();
    let canon = path.canonicalize().map_err(|e| TorchError::OpLibrary {
        path: path.display().to_string(),
        detail: e.to_string(),
    })?;
    if let Some(prev) = LOADED.get() {
        if *prev == canon {
            return Ok(());
        }
        return Err(TorchError::OpLibrary {
            path: path.display().to_string(),
            detail: format!("this process already loaded {}", prev.display()),
        });
    }
    cuda_available();
    let _schemas = SCHEMAS.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: the library's static initialisers register fact::gemm with the torch already in
    // this process; the handle is leaked because unloading would leave dangling op registrations.
    let lib = unsafe { libloading::os::unix::Library::open(Some(&canon), libc_flags()) }.map_err(
        |e| TorchError::OpLibrary {
            path: path.display().to_string(),
            detail: e.to_string(),
        },
    )?;
    std::mem::forget(lib);
    let _ = LOADED.set(canon);
    Ok(())
}

/// Calls of one kernel through fact's ops: how many ran it, how many of those copied an operand
/// into the kernel's layout first (its strides fit none), and how many fell back to the original
/// ops (and why the last one did).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OpCalls {
    pub ran: u64,
    #[serde(default)]
    pub copied: u64,
    pub fell_back: u64,
    /// Why the last call that fell back did, where the op says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// Calls of few rows that ran torch's ops by their kernel operand's choice (compose's small
    /// rows: torch measured faster there); no fallback.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub torch: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A handle on the op library this process loaded with `load_op_library`, for its C functions.
fn loaded_op_library(path: &Path) -> Result<libloading::os::unix::Library, TorchError> {
    let err = |detail: String| TorchError::OpLibrary {
        path: path.display().to_string(),
        detail,
    };
    let canon = path.canonicalize().map_err(|e| err(e.to_string()))?;
    // SAFETY: opening an already loaded library only takes another reference to it; dropping the
    // handle leaves the library loaded (load_op_library keeps its own).
    unsafe { libloading::os::unix::Library::open(Some(&canon), libc_flags()) }
        .map_err(|e| err(e.to_string()))
}

/// The op library's call counts per kernel since it was loaded (or `reset`), read from the
/// library this process loaded with `load_op_library`.
pub fn op_stats(
    path: &Path,
    reset: bool,
) -> Result<std::collections::BTreeMap<String, OpCalls>, TorchError> {
    let err = |detail: String| TorchError::OpLibrary {
        path: path.display().to_string(),
        detail,
    };
    let lib = loaded_op_library(path)?;
    // SAFETY: both functions are declared in templates/torch_op.cpp.hbs with exactly these
    // signatures; the text fact_op_stats returns stays valid until this thread's next call, after
    // the copy below.
    unsafe {
        if reset {
            let f: libloading::os::unix::Symbol<unsafe extern "C" fn()> = lib
                .get(b"fact_op_stats_reset")
                .map_err(|e| err(e.to_string()))?;
            f();
            return Ok(Default::default());
        }
        let f: libloading::os::unix::Symbol<unsafe extern "C" fn() -> *const std::os::raw::c_char> =
            lib.get(b"fact_op_stats").map_err(|e| err(e.to_string()))?;
        let text = std::ffi::CStr::from_ptr(f()).to_string_lossy().into_owned();
        serde_json::from_str(&text).map_err(|e| err(format!("op stats '{text}': {e}")))
    }
}

/// Turns the given pattern kinds of the loaded op library off (their calls run the original ops)
/// and every other kind on; an empty list turns all on.
pub fn disable_kinds(path: &Path, kinds: &[crate::rules::PatternKind]) -> Result<(), TorchError> {
    let err = |detail: String| TorchError::OpLibrary {
        path: path.display().to_string(),
        detail,
    };
    let lib = loaded_op_library(path)?;
    let names: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
    let text = std::ffi::CString::new(names.join(",")).expect("kind names hold no NUL");
    // SAFETY: declared in templates/torch_op.cpp.hbs as int32_t fact_disable(const char*); it
    // reads the string only during the call.
    let rc = unsafe {
        let f: libloading::os::unix::Symbol<
            unsafe extern "C" fn(*const std::os::raw::c_char) -> i32,
        > = lib.get(b"fact_disable").map_err(|e| {
            err(format!(
                "{e} (a library composed before fact could turn kinds off; compose again)"
            ))
        })?;
        f(text.as_ptr())
    };
    if rc != 0 {
        return Err(err(format!("fact_disable refused '{}'", names.join(","))));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_shapes_parse_and_reject_bad_text() {
        assert_eq!(
            InputShape::parse("4096x1024:bf16").unwrap(),
            InputShape {
                shape: vec![4096, 1024],
                dtype: "bf16".into()
            }
        );
        assert_eq!(InputShape::parse("8x8").unwrap().dtype, "f32");
        assert!(InputShape::parse("8xa:f32")
            .unwrap_err()
            .contains("dims joined by x"));
        assert!(InputShape::parse("8x8:f8")
            .unwrap_err()
            .contains("not one of"));
    }
}
