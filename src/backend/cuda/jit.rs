//! NVRTC compilation of kernel instantiations, cached in memory and on disk.
//!
//! A kernel type renders its template instantiation (`mxfp8_quantize_kernel<128>`); the source
//! it names is `kernels/common.cuh` followed by the kernel's file, compiled to an sm_90a cubin
//! and looked up by NVRTC's lowered name. The cache key is (hash of the full source,
//! instantiation, arch), so an edited kernel file never reuses a stale cubin.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};

use crate::error::{Error, Result};

/// The definitions every kernel source is compiled with (prepended; kernels have no #include).
pub const COMMON_SOURCE: &str = include_str!("../../../kernels/common.cuh");

/// A GPU architecture the kernels are compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    /// Hopper with its architecture-specific features (wgmma, setmaxnreg): H100, H200.
    Sm90a,
}

impl Arch {
    /// The architecture for a device's compute capability, if the kernels support it.
    pub fn from_compute_capability(major: i32, minor: i32) -> Option<Self> {
        (major == 9 && minor == 0).then_some(Arch::Sm90a)
    }

    /// NVRTC's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Arch::Sm90a => "sm_90a",
        }
    }
}

/// A compiled kernel: the cubin and the symbol of the instantiation inside it.
#[derive(Clone, Debug)]
pub struct CompiledKernel {
    /// The sm_90a machine code.
    pub cubin: Vec<u8>,
    /// NVRTC's lowered (mangled) name of the instantiation.
    pub lowered_name: String,
}

/// The full source of a kernel file: the shared definitions, then the file.
pub fn full_source(kernel_source: &str) -> String {
    format!("{COMMON_SOURCE}\n{kernel_source}")
}

/// Compiles `instantiation` of `kernel_source` (a file of `kernels/`, without common.cuh) with
/// NVRTC. Needs libnvrtc.so.13, not a GPU.
pub fn compile_kernel(
    kernel_source: &str,
    instantiation: &str,
    arch: Arch,
) -> Result<CompiledKernel> {
    if !super::nvrtc_present() {
        return Err(Error::NoNvrtc);
    }
    let compile_error = |log: String| Error::Compile {
        instantiation: instantiation.to_string(),
        log,
    };
    let src = CString::new(full_source(kernel_source)).map_err(|e| compile_error(e.to_string()))?;
    let expr = CString::new(instantiation).map_err(|e| compile_error(e.to_string()))?;
    let prog = nvrtc::create_program(&src, Some(c"shapeproof.cu"))
        .map_err(|e| compile_error(format!("{e:?}")))?;
    let out = (|| {
        // SAFETY: `prog` is a live program and `expr` outlives the call.
        unsafe { nvrtc_sys::nvrtcAddNameExpression(prog, expr.as_ptr()) }
            .result()
            .map_err(|e| compile_error(format!("{e:?}")))?;
        let options = [
            format!("--gpu-architecture={}", arch.as_str()),
            "-std=c++17".to_string(),
            "--device-int128".to_string(),
        ];
        // SAFETY: `prog` is a live program.
        if let Err(e) = unsafe { nvrtc::compile_program(prog, &options) } {
            // SAFETY: as above.
            let log = unsafe { nvrtc::get_program_log(prog) }
                .map(|chars| c_chars_to_string(&chars))
                .unwrap_or_default();
            return Err(compile_error(format!("{e:?}\n{log}")));
        }
        let mut lowered: *const c_char = std::ptr::null();
        // SAFETY: `prog` compiled; NVRTC owns the returned string until the program is destroyed,
        // and it is copied before that.
        unsafe { nvrtc_sys::nvrtcGetLoweredName(prog, expr.as_ptr(), &mut lowered) }
            .result()
            .map_err(|e| compile_error(format!("{e:?}")))?;
        // SAFETY: NVRTC returned a NUL-terminated string.
        let lowered_name = unsafe { CStr::from_ptr(lowered) }
            .to_string_lossy()
            .into_owned();
        let mut size = 0usize;
        // SAFETY: `prog` compiled.
        unsafe { nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size) }
            .result()
            .map_err(|e| compile_error(format!("{e:?}")))?;
        let mut cubin = vec![0u8; size];
        // SAFETY: `cubin` has the size NVRTC reported.
        unsafe { nvrtc_sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut c_char) }
            .result()
            .map_err(|e| compile_error(format!("{e:?}")))?;
        Ok(CompiledKernel {
            cubin,
            lowered_name,
        })
    })();
    // SAFETY: `prog` is live and destroyed once.
    let _ = unsafe { nvrtc::destroy_program(prog) };
    out
}

fn c_chars_to_string(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// FNV-1a, 64 bit: a hash that is stable across runs, builds and Rust versions.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in *part {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The compiled-kernel cache: a process-wide map in memory, and a folder on disk.
///
/// The folder is `$SHAPEPROOF_CACHE_DIR`, else `$XDG_CACHE_HOME/shapeproof`, else
/// `$HOME/.cache/shapeproof`; `SHAPEPROOF_CACHE_DIR=off` disables the disk layer.
#[derive(Clone, Debug)]
pub struct KernelCache {
    dir: Option<PathBuf>,
}

fn memory() -> &'static Mutex<HashMap<u64, Arc<CompiledKernel>>> {
    static MEMORY: OnceLock<Mutex<HashMap<u64, Arc<CompiledKernel>>>> = OnceLock::new();
    MEMORY.get_or_init(|| Mutex::new(HashMap::new()))
}

impl KernelCache {
    /// The cache configured by the environment.
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        let dir = match var("SHAPEPROOF_CACHE_DIR") {
            Some(v) if v == "off" => None,
            Some(v) => Some(PathBuf::from(v)),
            None => var("XDG_CACHE_HOME")
                .map(|d| PathBuf::from(d).join("shapeproof"))
                .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache/shapeproof"))),
        };
        Self { dir }
    }

    /// A cache with the disk layer in `dir` (or none).
    pub fn with_dir(dir: Option<PathBuf>) -> Self {
        Self { dir }
    }

    /// The compiled instantiation, from memory, from disk, or compiled now (and stored).
    pub fn get_or_compile(
        &self,
        kernel_source: &str,
        instantiation: &str,
        arch: Arch,
    ) -> Result<Arc<CompiledKernel>> {
        let key = fnv1a(&[
            COMMON_SOURCE.as_bytes(),
            kernel_source.as_bytes(),
            instantiation.as_bytes(),
            arch.as_str().as_bytes(),
        ]);
        if let Some(hit) = memory().lock().expect("kernel cache lock").get(&key) {
            return Ok(hit.clone());
        }
        let compiled = Arc::new(match self.read_disk(key) {
            Some(k) => k,
            None => {
                let k = compile_kernel(kernel_source, instantiation, arch)?;
                self.write_disk(key, &k)?;
                k
            }
        });
        memory()
            .lock()
            .expect("kernel cache lock")
            .insert(key, compiled.clone());
        Ok(compiled)
    }

    fn paths(&self, key: u64) -> Option<(PathBuf, PathBuf)> {
        self.dir.as_ref().map(|d| {
            (
                d.join(format!("{key:016x}.cubin")),
                d.join(format!("{key:016x}.name")),
            )
        })
    }

    fn read_disk(&self, key: u64) -> Option<CompiledKernel> {
        let (cubin, name) = self.paths(key)?;
        Some(CompiledKernel {
            cubin: std::fs::read(cubin).ok()?,
            lowered_name: std::fs::read_to_string(name).ok()?,
        })
    }

    fn write_disk(&self, key: u64, k: &CompiledKernel) -> Result<()> {
        let Some((cubin, name)) = self.paths(key) else {
            return Ok(());
        };
        let dir = cubin
            .parent()
            .expect("cache file has a folder")
            .to_path_buf();
        let io = |path: PathBuf| move |source| Error::Cache { path, source };
        std::fs::create_dir_all(&dir).map_err(io(dir.clone()))?;
        // Write the name last: a reader needs both files, and a torn cubin without its name
        // is never used.
        std::fs::write(&cubin, &k.cubin).map_err(io(cubin.clone()))?;
        std::fs::write(&name, &k.lowered_name).map_err(io(name.clone()))?;
        Ok(())
    }
}
