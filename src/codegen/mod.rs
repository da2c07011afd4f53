//! Renders what every kernel library has around its kinds' code, from the handlebars templates in
//! templates/: the dispatch table over every kernel and the torch op library's frame around each
//! kind's section; and what each kind's renderer shares (the template registry's settings, a
//! rendered `Source`, the ABI's dtype codes, units of several kernels). Each kind renders its own
//! kernels and op section (`crate::kinds`). Pure: the same specs render byte-identical source, and
//! nothing here touches the disk or the GPU (templates are compiled into the binary).

use handlebars::Handlebars;
use serde_json::json;
use sha2::Digest;
use std::sync::OnceLock;

const DISPATCH: &str = include_str!("../../templates/dispatch.cpp.hbs");
const TORCH_OP: &str = include_str!("../../templates/torch_op.cpp.hbs");

/// The partial the norm kinds' kernels share for the residual add before the norm
/// (`rules::residual`): `{{> residual_add host=false}}` the device helpers, `host=true` the host
/// checks of the add's tensors.
pub const RESIDUAL_ADD: (&str, &str) = (
    "residual_add",
    include_str!("../../templates/residual_add.cu.hbs"),
);

/// The partial of what a kernel keeps per device (`{{> per_device adapter=…}}` inside its
/// namespace): its dynamic shared memory opt-in, made once per device rather than on every launch,
/// and with `adapter=true` the launch of a CUTLASS 3.x adapter around it.
pub const PER_DEVICE: (&str, &str) = ("per_device", include_str!("../../templates/per_device.hbs"));

/// A handlebars registry as every template here is rendered: strict (a missing variable is an
/// error), no escaping (the output is C++), `partials` registered for `templates` to use. Each
/// kind keeps one for its own templates.
pub fn templates(partials: &[(&str, &str)], templates: &[(&str, &str)]) -> Handlebars<'static> {
    let mut h = Handlebars::new();
    h.set_strict_mode(true);
    h.register_escape_fn(handlebars::no_escape);
    for (name, text) in partials {
        h.register_partial(name, *text)
            .unwrap_or_else(|e| panic!("partial {name}: {e}"));
    }
    for (name, text) in templates {
        h.register_template_string(name, *text)
            .unwrap_or_else(|e| panic!("template {name}: {e}"));
    }
    h
}

/// The library-level templates: the dispatch table and the torch op library's frame.
fn library_templates() -> &'static Handlebars<'static> {
    static R: OnceLock<Handlebars<'static>> = OnceLock::new();
    R.get_or_init(|| templates(&[], &[("dispatch", DISPATCH), ("torch_op", TORCH_OP)]))
}

/// A rendered source file, named for the build.
#[derive(Clone, Debug, PartialEq)]
pub struct Source {
    pub file_name: String,
    pub text: String,
}

/// A dtype as FactTensor::dtype (FactDtype) says it.
pub fn dtype_abi(d: crate::types::DType) -> u32 {
    match d {
        crate::types::DType::F32 => 0,
        crate::types::DType::Bf16 => 1,
        crate::types::DType::F16 => 2,
    }
}

/// CUDA's own type of a dtype's elements (fact's kernels without CUTLASS).
pub fn cuda_element(d: crate::types::DType) -> &'static str {
    match d {
        crate::types::DType::F32 => "float",
        crate::types::DType::Bf16 => "__nv_bfloat16",
        crate::types::DType::F16 => "__half",
    }
}

/// The integer type one vector load of `bytes` bytes moves as (fact's kernels without CUTLASS);
/// `kernel` names the spec, whose invalid_reason refuses any other width.
pub fn vector_type(kernel: &str, bytes: u32) -> &'static str {
    match bytes {
        16 => "uint4",
        8 => "uint2",
        4 => "unsigned int",
        2 => "unsigned short",
        other => panic!("{kernel}: a {other}-byte vector (invalid_reason refuses it)"),
    }
}

/// The translation unit of kernels already rendered (each in its own namespace), so a sweep
/// builds as one unit per core rather than one per kernel. Named for its contents.
pub fn unit_of(sources: &[&Source]) -> Source {
    match sources {
        [one] => (*one).clone(),
        _ => {
            let text: String = sources
                .iter()
                .map(|s| s.text.as_str())
                .collect::<Vec<_>>()
                .join("\n");
            let names: Vec<&str> = sources
                .iter()
                .map(|s| s.file_name.trim_end_matches(".cu"))
                .collect();
            let digest = sha2::Sha256::digest(names.join(",").as_bytes());
            let tag: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
            Source {
                file_name: format!("unit_{}k_{tag}.cu", sources.len()),
                text,
            }
        }
    }
}

/// One entry of a library's dispatch table: a kernel variant of any kind.
#[derive(Clone, Debug, PartialEq)]
pub struct DispatchEntry {
    /// The variant's name (what the op and the tuner look the entry up by).
    pub name: String,
    /// The compiled kernel's symbol stem: `fact_k_<symbol>_run`.
    pub symbol: String,
    /// The kind the op checks: "gemm", "attention", "layernorm".
    pub kind: &'static str,
    /// What its tensors and scalars are, by position.
    pub signature: String,
    pub spec_json: String,
    pub dtype: &'static str,
    pub layout: String,
    pub epilogue: String,
    /// Launch knobs: splits, raster, swizzle.
    pub knobs: [i64; 3],
}

/// The dispatch table over `entries`, in the given order (index = position): a GEMM variant's
/// entry holds its kernel and its launch knobs.
pub fn render_dispatch(entries: &[DispatchEntry]) -> Source {
    let kernels: Vec<_> = entries
        .iter()
        .map(|e| {
            json!({
                "name": e.name,
                "symbol": e.symbol,
                "kind": e.kind,
                "signature": e.signature,
                "spec_json": e.spec_json,
                "dtype": e.dtype,
                "layout": e.layout,
                "epilogue": e.epilogue,
                "splits": e.knobs[0],
                "raster": e.knobs[1],
                "swizzle": e.knobs[2],
            })
        })
        .collect();
    let mut symbols: Vec<&str> = entries.iter().map(|e| e.symbol.as_str()).collect();
    symbols.sort();
    symbols.dedup();
    let text = library_templates()
        .render(
            "dispatch",
            &json!({ "kernels": kernels, "symbols": symbols, "count": entries.len() }),
        )
        .expect("dispatch renders");
    Source {
        file_name: "fact_dispatch.cpp".into(),
        text,
    }
}

/// One op of the torch op library: its name (`fact::<name>`), its schema, the C++ function of its
/// section that implements it on CPU and CUDA tensors (its kernel where the call fits, else the
/// original ops), and the one that gives its outputs' sizes, strides and dtypes from its inputs'
/// alone, on Meta (and so Fake) tensors, symbolic sizes included: what torch.export, torch.compile
/// and AOTInductor read. The frame registers the pair under the op's autograd kernel. An op
/// without a meta function (the frame's memo) stays CompositeImplicitAutograd: its function
/// runs for every tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpDef {
    pub name: &'static str,
    pub schema: &'static str,
    pub function: &'static str,
    pub meta: Option<&'static str>,
    /// Tagged `flexible_layout`: torch.compile and AOTInductor may hand the op its inputs in any
    /// layout (it reads any strides, copying where a kernel cannot). Under torch's default for
    /// custom ops (exact strides) Inductor copies a tensor it computes into a buffer of its own for
    /// each op that reads it: a causal mask every attention call reads is written once a layer.
    /// Only for an op whose outputs' layout does not follow its inputs' strides: Inductor lays
    /// the outputs out from the graph's example inputs, not from the layouts it chooses.
    pub flexible_layout: bool,
}

/// A kind's section of the torch op library: `prelude` before the library's anonymous namespace
/// (headers of its own), `body` inside it (the ops and their fallbacks).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpCode {
    pub prelude: String,
    pub body: String,
}

/// An op's C shim: the C function Inductor's C++ wrappers (torch.compile's `cpp_wrapper`,
/// AOTInductor) call in place of a call through Python or the dispatcher, once the op is
/// registered in `torch._inductor.config.aot_inductor.custom_ops_to_c_shims`
/// (`fact.use_c_shims`). Its parameters follow torch's c-shim convention, as Inductor passes
/// them: a tensor as a handle, an optional one as a pointer to one (null for None), a list as a
/// pointer and a length, a str as a C string, each result through `ret0`, `ret1`, ... An optional
/// list is a pointer to the list's pointer, null for None; Inductor passes an empty one as a
/// pointer to a `nullptr_t`, so the parameter is `const void*` and its pointer is read only when
/// the length is not 0. `params` declares them; `body` calls the op's `function` with them and
/// hands its results back. None for an op whose schema has a type outside that convention or
/// returns anything but tensors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CShim {
    pub params: String,
    pub body: String,
}

pub fn c_shim(schema: &str, function: &str) -> Option<CShim> {
    let (_, rest) = schema.split_once('(')?;
    let (args, ret) = rest.rsplit_once(") -> ")?;
    let ret = ret.trim();
    let results = if ret == "Tensor" {
        1
    } else {
        let inner = ret.strip_prefix('(')?.strip_suffix(')')?;
        let parts: Vec<&str> = inner.split(", ").collect();
        if !parts.iter().all(|p| p.trim() == "Tensor") {
            return None;
        }
        parts.len()
    };
    let (mut params, mut call) = (Vec::new(), Vec::new());
    for arg in args.split(", ") {
        let arg = arg.split('=').next()?.trim();
        if arg == "*" {
            continue;
        }
        let (ty, name) = arg.rsplit_once(' ')?;
        let (param, value) = match ty.trim() {
            "Tensor" => (
                format!("AtenTensorHandle {name}"),
                format!("fact_shim::tensor({name})"),
            ),
            "Tensor?" => (
                format!("AtenTensorHandle* {name}"),
                format!("fact_shim::optional({name})"),
            ),
            "Tensor[]" => (
                format!("const AtenTensorHandle* {name}, int64_t {name}_len_"),
                format!("at::TensorList(fact_shim::list({name}, {name}_len_))"),
            ),
            "Tensor[]?" => (
                format!("const void* {name}, int64_t {name}_len_"),
                format!("fact_shim::optional_list({name}, {name}_len_)"),
            ),
            "int[]" => (
                format!("const int64_t* {name}, int64_t {name}_len_"),
                format!("at::IntArrayRef({name}, {name}_len_)"),
            ),
            "int" => (format!("int64_t {name}"), name.to_string()),
            "float" => (format!("double {name}"), name.to_string()),
            "bool" => (format!("int32_t {name}"), format!("{name} != 0")),
            "str" => (
                format!("const char* {name}"),
                format!("c10::string_view({name})"),
            ),
            _ => return None,
        };
        params.push(param);
        call.push(value);
    }
    params.extend((0..results).map(|i| format!("AtenTensorHandle* ret{i}")));
    let call = format!("{function}({})", call.join(", "));
    let body = if results == 1 {
        format!("*ret0 = torch::aot_inductor::new_tensor_handle({call});")
    } else {
        let mut b = format!("auto r = {call};");
        for i in 0..results {
            b.push_str(&format!(
                " *ret{i} = torch::aot_inductor::new_tensor_handle(std::move(std::get<{i}>(r)));"
            ));
        }
        b
    };
    Some(CShim {
        params: params.join(", "),
        body,
    })
}

/// The variables every op section renders with: the library's arch and the devices that run it.
pub fn op_vars(arch: crate::types::Arch) -> serde_json::Value {
    let names: Vec<String> = arch
        .devices()
        .iter()
        .map(|(major, minor)| format!("{major}.{minor}"))
        .collect();
    json!({ "arch": arch.short_name(), "devices": names.join(" or ") })
}

/// The frame's own ops (no kind's): the memo that keeps values a forward computes from its
/// inputs' shapes and the module's buffers alone (`torch::memoize_static_values` calls them).
/// They have no meta function and stay CompositeImplicitAutograd: what memo_get returns (the
/// values kept, or none) depends on what the process kept, not on its inputs' metadata, so no
/// meta function can say it; and only TorchScript outputs call them (their state lives in the
/// library, which an exported program cannot carry).
pub const FRAME_OPS: &[OpDef] = &[
    OpDef {
        name: "memo_get",
        schema: "memo_get(int site, Tensor[] shapes, Tensor[] state) -> Tensor[]",
        function: "memo_get",
        meta: None,
        flexible_layout: false,
    },
    OpDef {
        name: "memo_put",
        schema: "memo_put(int site, Tensor[] shapes, Tensor[] state, Tensor[] values) -> Tensor[]",
        function: "memo_put",
        meta: None,
        flexible_layout: false,
    },
];

/// The frame's switch beside the kinds' (`fact_disable("memo")`): a memo turned off computes its
/// values on every call.
pub const MEMO_SWITCH: &str = "memo";

/// The torch op library for `arch`: the shared frame (helpers, the kinds a user turns off by
/// name, call counts, schemas and registrations) around each kind's section (`sections`: its
/// ops and its code, in the registry's order); `switches` are the pattern kinds' names, in the
/// order of their bits. It is the same for every library of one arch.
pub fn render_torch_op(
    arch: crate::types::Arch,
    sections: &[(&[OpDef], OpCode)],
    switches: &[&str],
) -> Source {
    let check: Vec<String> = arch
        .devices()
        .iter()
        .map(|(major, minor)| format!("(props.major == {major} && props.minor == {minor})"))
        .collect();
    let kinds: Vec<_> = switches
        .iter()
        .chain([&MEMO_SWITCH])
        .enumerate()
        .map(|(i, name)| {
            let mut ident: Vec<char> = name.chars().collect();
            ident[0] = ident[0].to_ascii_uppercase();
            json!({
                "name": name,
                "ident": format!("k{}Kind", ident.into_iter().collect::<String>()),
                "bit": 1u32 << i,
            })
        })
        .collect();
    let ops: Vec<&OpDef> = sections
        .iter()
        .flat_map(|(ops, _)| ops.iter())
        .chain(FRAME_OPS)
        .collect();
    let mut vars = op_vars(arch);
    vars["device_check"] = json!(check.join(" || "));
    vars["kinds"] = json!(kinds);
    vars["all"] = json!((1u32 << (switches.len() + 1)) - 1);
    // Only an op with a meta function is one Inductor compiles a call of.
    let shims: Vec<Option<CShim>> = ops
        .iter()
        .map(|o| o.meta.and_then(|_| c_shim(o.schema, o.function)))
        .collect();
    vars["ops"] = json!(ops
        .iter()
        .zip(&shims)
        .map(|(o, shim)| {
            let tags = if o.flexible_layout {
                "at::Tag::pt2_compliant_tag, at::Tag::flexible_layout"
            } else {
                "at::Tag::pt2_compliant_tag"
            };
            json!({ "name": o.name, "schema": o.schema, "function": o.function, "meta": o.meta, "tags": tags,
                    "shim": shim.as_ref().map(|c| json!({ "params": c.params, "body": c.body })) })
        })
        .collect::<Vec<_>>());
    // What `fact.use_c_shims` registers: each shimmed op's declarations, one per device.
    let shims: serde_json::Map<String, serde_json::Value> = ops
        .iter()
        .zip(&shims)
        .filter_map(|(o, shim)| {
            let c = shim.as_ref()?;
            let decls: Vec<String> = ["cpu", "cuda"]
                .iter()
                .map(|d| format!("AOTITorchError aoti_torch_{d}_{}({})", o.name, c.params))
                .collect();
            Some((o.name.to_string(), json!(decls)))
        })
        .collect();
    vars["shims_json"] = json!(serde_json::to_string(&shims).expect("shims serialize"));
    vars["sections"] = json!(sections
        .iter()
        .map(|(_, code)| json!({ "prelude": code.prelude, "body": code.body }))
        .collect::<Vec<_>>());
    let text = library_templates()
        .render("torch_op", &vars)
        .expect("torch op renders");
    Source {
        file_name: "fact_torch_op.cpp".into(),
        text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shim_takes_each_argument_as_inductor_passes_it_and_hands_back_each_result() {
        let c = c_shim(
            "op(Tensor a, Tensor? b, Tensor[] xs, Tensor[]? ys, int[] dims, int n, float eps, bool on, str kernel) -> (Tensor, Tensor)",
            "op_fn",
        )
        .unwrap();
        assert_eq!(
            c.params,
            "AtenTensorHandle a, AtenTensorHandle* b, const AtenTensorHandle* xs, int64_t xs_len_, \
             const void* ys, int64_t ys_len_, const int64_t* dims, int64_t dims_len_, int64_t n, \
             double eps, int32_t on, const char* kernel, AtenTensorHandle* ret0, AtenTensorHandle* ret1"
        );
        assert!(c.body.starts_with(
            "auto r = op_fn(fact_shim::tensor(a), fact_shim::optional(b), \
             at::TensorList(fact_shim::list(xs, xs_len_)), fact_shim::optional_list(ys, ys_len_), \
             at::IntArrayRef(dims, dims_len_), n, eps, on != 0, c10::string_view(kernel));"
        ));
        assert!(c.body.contains(
            "*ret1 = torch::aot_inductor::new_tensor_handle(std::move(std::get<1>(r)));"
        ));
        // A default and the keyword-only marker change nothing; one result is handed back whole.
        let one = c_shim("g(Tensor x, *, Tensor? c=None) -> Tensor", "g").unwrap();
        assert_eq!(
            one.params,
            "AtenTensorHandle x, AtenTensorHandle* c, AtenTensorHandle* ret0"
        );
        assert_eq!(
            one.body,
            "*ret0 = torch::aot_inductor::new_tensor_handle(g(fact_shim::tensor(x), fact_shim::optional(c)));"
        );
        // Outside the convention: no shim, and the op keeps Inductor's default call.
        assert_eq!(c_shim("h(Tensor x, int? n) -> Tensor", "h"), None);
        assert_eq!(c_shim("h(Tensor x) -> Tensor[]", "h"), None);
        assert_eq!(c_shim("h(Tensor x) -> (Tensor, int)", "h"), None);
    }
}
