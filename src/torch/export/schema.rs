//! The parts of torch.export's serialized program (`models/model.json` of a `.pt2` archive,
//! torch's `torch/_export/serde/schema.py`, schema 8.x) that fact reads, as serde types. Unions
//! are JSON objects of one key (`{"as_tensor": {"name": "x"}}`): externally tagged enums here.
//! Fields fact does not read are not declared (serde skips them); the writer edits the archive's
//! JSON as a `serde_json::Value`, so nothing it does not know is lost.

use serde::Deserialize;
use std::collections::BTreeMap;

/// The schema majors fact reads: 8 is torch 2.6 to 2.11's.
pub const KNOWN_MAJOR: i64 = 8;

#[derive(Debug, Deserialize)]
pub struct ExportedProgram {
    pub graph_module: GraphModule,
    #[serde(default)]
    pub range_constraints: BTreeMap<String, RangeConstraint>,
    pub schema_version: SchemaVersion,
    #[serde(default)]
    pub torch_version: String,
}

#[derive(Debug, Deserialize)]
pub struct SchemaVersion {
    pub major: i64,
    pub minor: i64,
}

#[derive(Clone, Debug, Deserialize)]
pub struct RangeConstraint {
    pub min_val: Option<i64>,
    pub max_val: Option<i64>,
}

#[derive(Debug, Deserialize)]
pub struct GraphModule {
    pub graph: Graph,
    pub signature: GraphSignature,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Graph {
    pub inputs: Vec<Argument>,
    pub outputs: Vec<Argument>,
    pub nodes: Vec<Node>,
    #[serde(default)]
    pub tensor_values: BTreeMap<String, TensorMeta>,
    #[serde(default)]
    pub sym_int_values: BTreeMap<String, SymInt>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Node {
    pub target: String,
    pub inputs: Vec<NamedArgument>,
    pub outputs: Vec<Argument>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct NamedArgument {
    pub name: String,
    pub arg: Argument,
    #[serde(default)]
    pub kind: Option<i64>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct TensorArgument {
    pub name: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SymIntArgument {
    AsName(String),
    AsInt(i64),
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SymFloatArgument {
    AsName(String),
    #[serde(deserialize_with = "float")]
    AsFloat(f64),
}

/// A float as export writes it: a JSON number, or "Infinity", "-Infinity" or "NaN" (which JSON
/// numbers cannot hold).
#[derive(Deserialize)]
#[serde(untagged)]
enum JsonFloat {
    Number(f64),
    Text(String),
}

impl JsonFloat {
    fn value<E: serde::de::Error>(self) -> Result<f64, E> {
        match self {
            JsonFloat::Number(f) => Ok(f),
            JsonFloat::Text(t) => match t.as_str() {
                "Infinity" => Ok(f64::INFINITY),
                "-Infinity" => Ok(f64::NEG_INFINITY),
                "NaN" => Ok(f64::NAN),
                other => Err(E::custom(format!("{other:?} is no float"))),
            },
        }
    }
}

fn float<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    JsonFloat::deserialize(d)?.value()
}

fn floats<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
    Vec::<JsonFloat>::deserialize(d)?
        .into_iter()
        .map(JsonFloat::value)
        .collect()
}

/// A float as export's JSON writes it (`float`'s inverse).
pub fn float_json(f: f64) -> serde_json::Value {
    if f.is_nan() {
        "NaN".into()
    } else if f.is_infinite() {
        (if f > 0.0 { "Infinity" } else { "-Infinity" }).into()
    } else {
        f.into()
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SymBoolArgument {
    AsName(String),
    AsBool(bool),
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OptionalTensorArgument {
    AsTensor(TensorArgument),
    AsNone(bool),
}

#[derive(Clone, Debug, Deserialize)]
pub struct Device {
    #[serde(rename = "type")]
    pub kind: String,
    pub index: Option<i64>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct GraphArgument {
    pub name: String,
    pub graph: Box<Graph>,
}

/// An argument or output (schema.py's `Argument` union, every variant of schema 8.17). Variants
/// fact cannot pass on to an op are read (so the program parses) and refused where they are used.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Argument {
    AsNone(serde::de::IgnoredAny),
    AsTensor(TensorArgument),
    AsTensors(Vec<TensorArgument>),
    AsInt(i64),
    AsInts(Vec<i64>),
    #[serde(deserialize_with = "float")]
    AsFloat(f64),
    #[serde(deserialize_with = "floats")]
    AsFloats(Vec<f64>),
    AsString(String),
    AsStrings(Vec<String>),
    AsSymInt(SymIntArgument),
    AsSymInts(Vec<SymIntArgument>),
    AsScalarType(i64),
    AsMemoryFormat(i64),
    AsLayout(i64),
    AsDevice(Device),
    AsBool(bool),
    AsBools(Vec<bool>),
    AsSymBool(SymBoolArgument),
    AsSymBools(Vec<SymBoolArgument>),
    AsGraph(GraphArgument),
    AsOptionalTensors(Vec<OptionalTensorArgument>),
    AsOptionalTensor(OptionalTensorArgument),
    AsSymFloat(SymFloatArgument),
    AsSymFloats(Vec<SymFloatArgument>),
    AsComplex(serde::de::IgnoredAny),
    AsCustomObj(serde::de::IgnoredAny),
    AsOperator(serde::de::IgnoredAny),
    AsNestedTensors(serde::de::IgnoredAny),
    AsIntLists(serde::de::IgnoredAny),
    AsStringToArgument(serde::de::IgnoredAny),
}

impl Argument {
    /// The union's key, for messages.
    pub fn what(&self) -> &'static str {
        match self {
            Argument::AsNone(_) => "as_none",
            Argument::AsTensor(_) => "as_tensor",
            Argument::AsTensors(_) => "as_tensors",
            Argument::AsInt(_) => "as_int",
            Argument::AsInts(_) => "as_ints",
            Argument::AsFloat(_) => "as_float",
            Argument::AsFloats(_) => "as_floats",
            Argument::AsString(_) => "as_string",
            Argument::AsStrings(_) => "as_strings",
            Argument::AsSymInt(_) => "as_sym_int",
            Argument::AsSymInts(_) => "as_sym_ints",
            Argument::AsScalarType(_) => "as_scalar_type",
            Argument::AsMemoryFormat(_) => "as_memory_format",
            Argument::AsLayout(_) => "as_layout",
            Argument::AsDevice(_) => "as_device",
            Argument::AsBool(_) => "as_bool",
            Argument::AsBools(_) => "as_bools",
            Argument::AsSymBool(_) => "as_sym_bool",
            Argument::AsSymBools(_) => "as_sym_bools",
            Argument::AsGraph(_) => "as_graph",
            Argument::AsOptionalTensors(_) => "as_optional_tensors",
            Argument::AsOptionalTensor(_) => "as_optional_tensor",
            Argument::AsSymFloat(_) => "as_sym_float",
            Argument::AsSymFloats(_) => "as_sym_floats",
            Argument::AsComplex(_) => "as_complex",
            Argument::AsCustomObj(_) => "as_custom_obj",
            Argument::AsOperator(_) => "as_operator",
            Argument::AsNestedTensors(_) => "as_nested_tensors",
            Argument::AsIntLists(_) => "as_int_lists",
            Argument::AsStringToArgument(_) => "as_string_to_argument",
        }
    }
    /// The names of the values an output argument defines (none for a constant output).
    pub fn defined_names(&self) -> Vec<String> {
        match self {
            Argument::AsTensor(t) => vec![t.name.clone()],
            Argument::AsTensors(ts) => ts.iter().map(|t| t.name.clone()).collect(),
            Argument::AsSymInt(SymIntArgument::AsName(n))
            | Argument::AsSymFloat(SymFloatArgument::AsName(n))
            | Argument::AsSymBool(SymBoolArgument::AsName(n)) => vec![n.clone()],
            Argument::AsOptionalTensor(OptionalTensorArgument::AsTensor(t)) => vec![t.name.clone()],
            _ => vec![],
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SymInt {
    AsExpr(SymExpr),
    AsInt(i64),
}

#[derive(Clone, Debug, Deserialize)]
pub struct SymExpr {
    pub expr_str: String,
    #[serde(default)]
    pub hint: Option<SymExprHint>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SymExprHint {
    AsInt(i64),
    AsBool(bool),
    AsFloat(f64),
}

impl SymInt {
    /// The value at the program's sample inputs: the int, or the expression's hint.
    pub fn hint(&self) -> Option<i64> {
        match self {
            SymInt::AsInt(i) => Some(*i),
            SymInt::AsExpr(e) => match e.hint {
                Some(SymExprHint::AsInt(i)) => Some(i),
                _ => None,
            },
        }
    }
    /// Every value of `v` at the sample (`hint`), or None where one has no hint.
    pub fn hints(v: &[SymInt]) -> Option<Vec<i64>> {
        v.iter().map(SymInt::hint).collect()
    }
    /// The symbol's expression where the size is symbolic (`s23`, `2*s23`).
    pub fn symbol(&self) -> Option<String> {
        match self {
            SymInt::AsInt(_) => None,
            SymInt::AsExpr(e) => Some(sympy_name(&e.expr_str)),
        }
    }
}

/// `Symbol('s23', positive=True, integer=True)` as `s23`; any other expression as it is.
fn sympy_name(expr: &str) -> String {
    expr.strip_prefix("Symbol('")
        .and_then(|r| r.split_once('\''))
        .map(|(name, _)| name.to_string())
        .unwrap_or_else(|| expr.to_string())
}

#[derive(Clone, Debug, Deserialize)]
pub struct TensorMeta {
    pub dtype: i64,
    pub sizes: Vec<SymInt>,
    pub strides: Vec<SymInt>,
    #[serde(default)]
    pub storage_offset: Option<SymInt>,
    pub device: Device,
    #[serde(default)]
    pub layout: Option<i64>,
}

#[derive(Debug, Deserialize)]
pub struct GraphSignature {
    pub input_specs: Vec<InputSpec>,
    pub output_specs: Vec<OutputSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputSpec {
    UserInput {
        arg: Argument,
    },
    Parameter {
        arg: TensorArgument,
        parameter_name: String,
    },
    Buffer {
        arg: TensorArgument,
        buffer_name: String,
    },
    TensorConstant {
        arg: TensorArgument,
        tensor_constant_name: String,
    },
    ConstantInput {
        name: String,
        value: serde_json::Value,
    },
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputSpec {
    UserOutput {
        arg: Argument,
    },
    LossOutput(serde::de::IgnoredAny),
    BufferMutation(serde::de::IgnoredAny),
    GradientToParameter(serde::de::IgnoredAny),
    GradientToUserInput(serde::de::IgnoredAny),
    UserInputMutation(serde::de::IgnoredAny),
    ParameterMutation(serde::de::IgnoredAny),
    #[serde(other)]
    Other,
}

/// `data/weights/model_weights_config.json` and `data/constants/model_constants_config.json`:
/// the payload of each parameter, buffer and constant by its fully qualified name.
#[derive(Debug, Deserialize)]
pub struct PayloadConfig {
    pub config: BTreeMap<String, PayloadMeta>,
}

#[derive(Debug, Deserialize)]
pub struct PayloadMeta {
    pub path_name: String,
    #[serde(default)]
    pub use_pickle: bool,
    pub tensor_meta: Option<TensorMeta>,
}

/// fact's name for an export dtype code (schema.py's `ScalarType`), as the bridge spells dtypes.
pub fn dtype_name(code: i64) -> Option<&'static str> {
    Some(match code {
        1 => "u8",
        2 => "i8",
        3 => "i16",
        4 => "i32",
        5 => "i64",
        6 => "f16",
        7 => "f32",
        8 => "f64",
        12 => "bool",
        13 => "bf16",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unions_read_as_their_one_key() {
        let a: Argument =
            serde_json::from_str(r#"{"as_sym_ints": [{"as_int": -1}, {"as_name": "s"}]}"#).unwrap();
        match a {
            Argument::AsSymInts(v) => {
                assert!(matches!(v[0], SymIntArgument::AsInt(-1)));
                assert!(matches!(&v[1], SymIntArgument::AsName(n) if n == "s"));
            }
            other => panic!("{other:?}"),
        }
        let none: Argument = serde_json::from_str(r#"{"as_none": true}"#).unwrap();
        assert_eq!(none.what(), "as_none");
        let odd: Argument =
            serde_json::from_str(r#"{"as_complex": {"real": 1, "imag": 0}}"#).unwrap();
        assert_eq!(odd.what(), "as_complex");
    }

    #[test]
    fn a_symbolic_size_reads_its_symbol_and_hint() {
        let s: SymInt = serde_json::from_str(
            r#"{"as_expr": {"expr_str": "Symbol('s23', positive=True, integer=True)", "hint": {"as_int": 2}}}"#,
        )
        .unwrap();
        assert_eq!(s.symbol().as_deref(), Some("s23"));
        assert_eq!(s.hint(), Some(2));
        assert_eq!(dtype_name(13), Some("bf16"));
    }
}
