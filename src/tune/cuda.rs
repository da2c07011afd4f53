//! The few CUDA runtime and driver calls the measuring harness needs that tch does not expose:
//! events for timing and device facts for provenance. Bound at run time with libloading, to the
//! same libcudart that libtorch_cuda already loaded.

use libloading::Library;
use std::ffi::c_void;
use std::sync::OnceLock;

type Event = *mut c_void;

pub struct Cuda {
    _rt: Library,
    _drv: Option<Library>,
    event_create: unsafe extern "C" fn(*mut Event) -> i32,
    event_destroy: unsafe extern "C" fn(Event) -> i32,
    event_record: unsafe extern "C" fn(Event, *mut c_void) -> i32,
    event_sync: unsafe extern "C" fn(Event) -> i32,
    event_elapsed: unsafe extern "C" fn(*mut f32, Event, Event) -> i32,
    device_sync: unsafe extern "C" fn() -> i32,
    get_last_error: unsafe extern "C" fn() -> i32,
    error_string: unsafe extern "C" fn(i32) -> *const std::os::raw::c_char,
    attribute: unsafe extern "C" fn(*mut i32, i32, i32) -> i32,
    driver_version: unsafe extern "C" fn(*mut i32) -> i32,
    runtime_version: unsafe extern "C" fn(*mut i32) -> i32,
    device_name: Option<unsafe extern "C" fn(*mut std::os::raw::c_char, i32, i32) -> i32>,
    device_count: unsafe extern "C" fn(*mut i32) -> i32,
    device_uuid: Option<unsafe extern "C" fn(*mut [u8; 16], i32) -> i32>,
}

// cudaDeviceAttr values from driver_types.h.
const ATTR_SM_COUNT: i32 = 16;
const ATTR_CC_MAJOR: i32 = 75;
const ATTR_CC_MINOR: i32 = 76;

/// Facts about the GPU that go into every measurement's provenance.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct DeviceInfo {
    pub name: String,
    pub sm_count: i32,
    pub compute_capability: String,
    pub driver: String,
    pub cuda_runtime: String,
    /// The CUDA device ordinal among the devices the measuring fact saw (absent in runs recorded
    /// before tuning used several GPUs): the runs one sweep spread over two GPUs differ in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    /// The GPU's UUID as nvidia-smi prints it (`GPU-…`), where the driver tells it: which
    /// physical GPU that was, whatever CUDA_VISIBLE_DEVICES said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
}

fn version(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

impl Cuda {
    pub fn get() -> Result<&'static Cuda, String> {
        static C: OnceLock<Result<Cuda, String>> = OnceLock::new();
        C.get_or_init(Cuda::open).as_ref().map_err(Clone::clone)
    }

    fn open() -> Result<Cuda, String> {
        // SAFETY: loading the CUDA runtime runs no user code; the symbols below are the stable
        // C API of cuda_runtime_api.h / cuda.h with the declared signatures.
        unsafe {
            let rt = ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]
                .iter()
                .find_map(|n| Library::new(n).ok())
                .ok_or("cannot load libcudart (is torch's lib folder on LD_LIBRARY_PATH?)")?;
            let drv = Library::new("libcuda.so.1").ok();
            macro_rules! sym {
                ($lib:expr, $name:literal) => {
                    *$lib.get($name).map_err(|e| format!("libcudart: {e}"))?
                };
            }
            Ok(Cuda {
                event_create: sym!(rt, b"cudaEventCreate"),
                event_destroy: sym!(rt, b"cudaEventDestroy"),
                event_record: sym!(rt, b"cudaEventRecord"),
                event_sync: sym!(rt, b"cudaEventSynchronize"),
                event_elapsed: sym!(rt, b"cudaEventElapsedTime"),
                device_sync: sym!(rt, b"cudaDeviceSynchronize"),
                get_last_error: sym!(rt, b"cudaGetLastError"),
                error_string: sym!(rt, b"cudaGetErrorString"),
                attribute: sym!(rt, b"cudaDeviceGetAttribute"),
                driver_version: sym!(rt, b"cudaDriverGetVersion"),
                runtime_version: sym!(rt, b"cudaRuntimeGetVersion"),
                device_name: drv
                    .as_ref()
                    .and_then(|d| d.get(b"cuDeviceGetName").ok().map(|s| *s)),
                device_count: sym!(rt, b"cudaGetDeviceCount"),
                // CUDA 13's cuda.h maps cuDeviceGetUuid to its _v2 (same signature); older
                // drivers export only the first.
                device_uuid: drv.as_ref().and_then(|d| {
                    d.get(b"cuDeviceGetUuid_v2")
                        .or_else(|_| d.get(b"cuDeviceGetUuid"))
                        .ok()
                        .map(|s| *s)
                }),
                _rt: rt,
                _drv: drv,
            })
        }
    }

    fn check(&self, code: i32, what: &str) -> Result<(), String> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: cudaGetErrorString returns a static string for any code.
        let msg = unsafe { std::ffi::CStr::from_ptr((self.error_string)(code)) }
            .to_string_lossy()
            .into_owned();
        Err(format!("{what}: {msg}"))
    }

    /// Synchronizes the device and reports any error a kernel left behind (sticky or not).
    pub fn sync(&self) -> Result<(), String> {
        // SAFETY: no arguments.
        let code = unsafe { (self.device_sync)() };
        self.check(code, "cudaDeviceSynchronize")?;
        // SAFETY: no arguments.
        self.check(unsafe { (self.get_last_error)() }, "after launch")
    }

    /// Times `f` on the default stream with CUDA events; milliseconds.
    pub fn time_ms(&self, f: &mut dyn FnMut() -> Result<(), String>) -> Result<f64, String> {
        let mut start: Event = std::ptr::null_mut();
        let mut end: Event = std::ptr::null_mut();
        // SAFETY: events are created, used on the default stream and destroyed within this call.
        unsafe {
            self.check((self.event_create)(&mut start), "cudaEventCreate")?;
            self.check((self.event_create)(&mut end), "cudaEventCreate")?;
            let r = (|| {
                self.check(
                    (self.event_record)(start, std::ptr::null_mut()),
                    "cudaEventRecord",
                )?;
                f()?;
                self.check(
                    (self.event_record)(end, std::ptr::null_mut()),
                    "cudaEventRecord",
                )?;
                self.check((self.event_sync)(end), "cudaEventSynchronize")?;
                let mut ms = 0f32;
                self.check(
                    (self.event_elapsed)(&mut ms, start, end),
                    "cudaEventElapsedTime",
                )?;
                Ok(ms as f64)
            })();
            (self.event_destroy)(start);
            (self.event_destroy)(end);
            r
        }
    }

    pub fn device_info(&self, device: i32) -> DeviceInfo {
        let attr = |a: i32| {
            let mut v = 0;
            // SAFETY: writes one int.
            unsafe { (self.attribute)(&mut v, a, device) };
            v
        };
        let mut drv = 0;
        let mut rt = 0;
        // SAFETY: each writes one int.
        unsafe {
            (self.driver_version)(&mut drv);
            (self.runtime_version)(&mut rt);
        }
        let name = self
            .device_name
            .map(|f| {
                let mut buf = [0 as std::os::raw::c_char; 256];
                // SAFETY: the buffer holds 256 bytes and the driver writes a NUL-terminated name.
                unsafe {
                    f(buf.as_mut_ptr(), 256, device);
                    std::ffi::CStr::from_ptr(buf.as_ptr())
                        .to_string_lossy()
                        .into_owned()
                }
            })
            .unwrap_or_else(|| "unknown".into());
        DeviceInfo {
            name,
            sm_count: attr(ATTR_SM_COUNT),
            compute_capability: format!("{}.{}", attr(ATTR_CC_MAJOR), attr(ATTR_CC_MINOR)),
            driver: version(drv),
            cuda_runtime: version(rt),
            index: usize::try_from(device).ok(),
            uuid: self.uuid(device),
        }
    }

    /// How many CUDA devices this process sees (CUDA_VISIBLE_DEVICES applied); 0 on error.
    pub fn device_count(&self) -> usize {
        let mut n = 0;
        // SAFETY: writes one int.
        let code = unsafe { (self.device_count)(&mut n) };
        if code == 0 {
            usize::try_from(n).unwrap_or(0)
        } else {
            0
        }
    }

    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, the form CUDA_VISIBLE_DEVICES takes too.
    fn uuid(&self, device: i32) -> Option<String> {
        let f = self.device_uuid?;
        let mut b = [0u8; 16];
        // SAFETY: the driver writes the 16 bytes of a CUuuid; device ordinals are CUdevice
        // handles, as cuDeviceGetName above takes them.
        if unsafe { f(&mut b, device) } != 0 {
            return None;
        }
        let hex =
            |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
        Some(format!(
            "GPU-{}-{}-{}-{}-{}",
            hex(0..4),
            hex(4..6),
            hex(6..8),
            hex(8..10),
            hex(10..16)
        ))
    }

    pub fn capability(&self, device: i32) -> (i32, i32) {
        let mut major = 0;
        let mut minor = 0;
        // SAFETY: each writes one int.
        unsafe {
            (self.attribute)(&mut major, ATTR_CC_MAJOR, device);
            (self.attribute)(&mut minor, ATTR_CC_MINOR, device);
        }
        (major, minor)
    }
}
