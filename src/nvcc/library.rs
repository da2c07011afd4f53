//! A built kernel library opened for tuning: the dispatch table of include/fact_kernels.h (every
//! kind's kernels, called with tensors and scalars), bound with bindgen and called through
//! libloading.

use std::ffi::{CStr, CString};
use std::path::Path;

#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code
)]
pub mod abi {
    include!(concat!(env!("OUT_DIR"), "/fact_kernels.rs"));
}

pub use abi::{FactOpArgs, FactStatus, FactTensor};

type CountFn = unsafe extern "C" fn() -> i32;
type InfoFn = unsafe extern "C" fn(i32) -> *const abi::FactKernelInfo;
type FindFn = unsafe extern "C" fn(*const std::os::raw::c_char) -> i32;
type CanFn = unsafe extern "C" fn(i32, *const FactOpArgs) -> i32;
type WsFn = unsafe extern "C" fn(i32, *const FactOpArgs) -> usize;
type RunFn = unsafe extern "C" fn(
    i32,
    *const FactOpArgs,
    *mut std::ffi::c_void,
    usize,
    *mut std::ffi::c_void,
) -> i32;
type ErrFn = unsafe extern "C" fn() -> *const std::os::raw::c_char;

pub struct KernelLibrary {
    _lib: libloading::Library,
    count: CountFn,
    info: InfoFn,
    find: FindFn,
    can_implement: CanFn,
    workspace: WsFn,
    run: RunFn,
    last_error: ErrFn,
}

impl KernelLibrary {
    pub fn open(path: &Path) -> Result<KernelLibrary, String> {
        // SAFETY: the library is one fact built from templates/dispatch.cpp.hbs; its initialisers
        // only register the fact::gemm op with torch.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        // SAFETY: each symbol is declared in include/fact_kernels.h with exactly these signatures.
        unsafe {
            let version: libloading::Symbol<CountFn> =
                lib.get(b"fact_abi_version").map_err(|e| e.to_string())?;
            let v = version();
            if v != abi::FACT_ABI_VERSION as i32 {
                return Err(format!(
                    "{} has ABI version {v}, this fact expects {}",
                    path.display(),
                    abi::FACT_ABI_VERSION
                ));
            }
            Ok(KernelLibrary {
                count: *lib.get(b"fact_kernel_count").map_err(|e| e.to_string())?,
                info: *lib.get(b"fact_kernel_info").map_err(|e| e.to_string())?,
                find: *lib.get(b"fact_kernel_find").map_err(|e| e.to_string())?,
                can_implement: *lib
                    .get(b"fact_kernel_can_implement")
                    .map_err(|e| e.to_string())?,
                workspace: *lib
                    .get(b"fact_kernel_workspace_size")
                    .map_err(|e| e.to_string())?,
                run: *lib.get(b"fact_kernel_run").map_err(|e| e.to_string())?,
                last_error: *lib.get(b"fact_last_error").map_err(|e| e.to_string())?,
                _lib: lib,
            })
        }
    }

    pub fn len(&self) -> usize {
        // SAFETY: no arguments; reads a constant.
        unsafe { (self.count)() as usize }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A text field of kernel `index`'s info.
    fn info_text(
        &self,
        index: usize,
        field: fn(&abi::FactKernelInfo) -> *const std::os::raw::c_char,
    ) -> Option<String> {
        // SAFETY: the table returns NULL for a bad index and otherwise an entry whose text fields
        // are static NUL-terminated strings.
        unsafe {
            let info = (self.info)(index as i32);
            if info.is_null() {
                return None;
            }
            Some(CStr::from_ptr(field(&*info)).to_string_lossy().into_owned())
        }
    }

    pub fn name(&self, index: usize) -> Option<String> {
        self.info_text(index, |i| i.name)
    }

    /// The pattern kind of kernel `index`: "gemm", "attention" or "layernorm".
    pub fn kind(&self, index: usize) -> Option<String> {
        self.info_text(index, |i| i.kind)
    }

    /// The epilogue program of kernel `index` ("" for none and for kinds other than GEMM).
    pub fn epilogue(&self, index: usize) -> Option<String> {
        self.info_text(index, |i| i.epilogue)
    }

    pub fn find(&self, name: &str) -> Option<usize> {
        let c = CString::new(name).ok()?;
        // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
        let i = unsafe { (self.find)(c.as_ptr()) };
        (i >= 0).then_some(i as usize)
    }

    pub fn can_implement(&self, index: usize, args: &FactOpArgs) -> bool {
        // SAFETY: `args` and the tensors it points to outlive the call; the kernel only reads them.
        unsafe { (self.can_implement)(index as i32, args) == FactStatus::FACT_OK as i32 }
    }

    pub fn workspace_size(&self, index: usize, args: &FactOpArgs) -> usize {
        // SAFETY: as for can_implement.
        unsafe { (self.workspace)(index as i32, args) }
    }

    /// Launches kernel `index` on the legacy default stream (the one tch uses).
    ///
    /// # Safety
    /// The tensors in `args` and `workspace` must be device memory of the sizes they state,
    /// alive until the launch completes.
    pub unsafe fn run(
        &self,
        index: usize,
        args: &FactOpArgs,
        workspace: *mut std::ffi::c_void,
        ws: usize,
    ) -> Result<(), String> {
        let status = (self.run)(index as i32, args, workspace, ws, std::ptr::null_mut());
        self.status(status)
    }

    fn status(&self, status: i32) -> Result<(), String> {
        if status == FactStatus::FACT_OK as i32 {
            return Ok(());
        }
        // SAFETY: fact_last_error returns this thread's static error text.
        let detail = unsafe {
            CStr::from_ptr((self.last_error)())
                .to_string_lossy()
                .into_owned()
        };
        Err(format!(
            "status {status}{}",
            if detail.is_empty() {
                String::new()
            } else {
                format!(": {detail}")
            }
        ))
    }
}
