//! NVRTC compilation of kernel instantiations, cached in memory and on disk.
//!
//! A kernel type renders its template instantiation (`mxfp8_quantize_kernel<128>`); the source
//! it names is `kernels/common.cuh` followed by the kernel's file, compiled to an sm_90a cubin
//! and looked up by NVRTC's lowered name.
//!
//! The cache is keyed by what it holds: the key is the text of everything the cubin depends on
//! (format version, arch, compiler options, instantiation, full source), and an entry is found
//! by the SHA-256 digest of that text and used only when its stored key text equals it, in
//! memory and on disk. No source, however chosen, can stand in for another's cubin: a kernel
//! type launches the machine code of its own source and instantiation, or nothing.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use sha2::{Digest, Sha256};

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

/// The NVRTC options every kernel is compiled with (part of the cache key). With
/// `SHAPEPROOF_LINE_INFO=1` in the environment (read once a process) the kernels also carry
/// line information, so that compute-sanitizer and Nsight Compute name source lines (a
/// debugging aid: such kernels are cached under their own key).
fn compile_options(arch: Arch) -> Vec<String> {
    let mut options = vec![
        format!("--gpu-architecture={}", arch.as_str()),
        "-std=c++17".to_string(),
        "--device-int128".to_string(),
    ];
    if line_info() {
        options.push("--generate-line-info".to_string());
    }
    options
}

/// Whether `SHAPEPROOF_LINE_INFO` asks for line information (any value but empty or `0`).
fn line_info() -> bool {
    static LINE_INFO: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LINE_INFO.get_or_init(|| {
        std::env::var_os("SHAPEPROOF_LINE_INFO").is_some_and(|v| !v.is_empty() && v != "0")
    })
}

/// Compiles `instantiation` of `kernel_source` (a file of `kernels/`, without common.cuh) with
/// NVRTC. Needs libnvrtc.so.13, not a GPU.
pub fn compile_kernel(
    kernel_source: &str,
    instantiation: &str,
    arch: Arch,
) -> Result<CompiledKernel> {
    compile_with(kernel_source, instantiation, arch, &[]).map(|(compiled, _)| compiled)
}

/// [`compile_kernel`], with what ptxas reports on the way (`--ptxas-options=--verbose`, which
/// leaves the cubin as it is): registers, spills, and the performance warnings, among them
/// C7510-C7515, which say that the compiler serialised a kernel's `wgmma` pipeline (each
/// product waited for before the next is issued). A kernel can be correct and several times
/// slower with them, so the kernel tests fail on them. Needs libnvrtc.so.13, not a GPU.
pub fn compile_kernel_reported(
    kernel_source: &str,
    instantiation: &str,
    arch: Arch,
) -> Result<(CompiledKernel, String)> {
    compile_with(
        kernel_source,
        instantiation,
        arch,
        &["--ptxas-options=--verbose"],
    )
}

/// [`compile_kernel`] with `extra` options after the usual ones; also returns NVRTC's log.
fn compile_with(
    kernel_source: &str,
    instantiation: &str,
    arch: Arch,
    extra: &[&str],
) -> Result<(CompiledKernel, String)> {
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
        let mut options = compile_options(arch);
        options.extend(extra.iter().map(|o| o.to_string()));
        // SAFETY: `prog` is a live program.
        let compiled = unsafe { nvrtc::compile_program(prog, &options) };
        // SAFETY: as above.
        let log = unsafe { nvrtc::get_program_log(prog) }
            .map(|chars| c_chars_to_string(&chars))
            .unwrap_or_default();
        if let Err(e) = compiled {
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
        Ok((
            CompiledKernel {
                cubin,
                lowered_name,
            },
            log,
        ))
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

/// Everything a compiled kernel depends on, as one text: the cache key, compared in full on
/// every hit.
fn key_text(kernel_source: &str, instantiation: &str, arch: Arch) -> String {
    let source = full_source(kernel_source);
    format!(
        "{FORMAT}\narch {}\noptions {}\ninstantiation {} {instantiation}\nsource {} bytes\n{source}",
        arch.as_str(),
        compile_options(arch).join(" "),
        instantiation.len(),
        source.len(),
    )
}

/// The first line of a key and of a disk entry: bumped whenever either's layout changes.
const FORMAT: &str = "shapeproof kernel cache 2";

/// A cache entry: the key it was compiled for, and the kernel.
struct Entry {
    key: String,
    kernel: Arc<CompiledKernel>,
}

type Digest32 = [u8; 32];

fn sha256(parts: &[&[u8]]) -> Digest32 {
    let mut h = Sha256::new();
    for part in parts {
        h.update(part);
    }
    h.finalize().into()
}

fn hex(digest: &Digest32) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The compiled-kernel cache: a process-wide map in memory, and a folder on disk.
///
/// The folder is `$SHAPEPROOF_CACHE_DIR`, else `$XDG_CACHE_HOME/shapeproof`, else
/// `$HOME/.cache/shapeproof`; `SHAPEPROOF_CACHE_DIR=off` disables the disk layer. A disk entry
/// is one file holding its key text, the kernel and a SHA-256 of both; one that is torn, of
/// another format, or of another key is compiled anew and replaced, never loaded. The folder
/// is trusted like the program's own files: whoever can write it can choose the machine code
/// the program runs (it is created readable by its owner only).
#[derive(Clone, Debug)]
pub struct KernelCache {
    dir: Option<PathBuf>,
}

fn memory() -> &'static Mutex<HashMap<Digest32, Arc<Entry>>> {
    static MEMORY: OnceLock<Mutex<HashMap<Digest32, Arc<Entry>>>> = OnceLock::new();
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

    /// The compiled instantiation, from memory, from disk, or compiled now (and stored). An
    /// entry is used only when the key text it was stored under equals this call's.
    pub fn get_or_compile(
        &self,
        kernel_source: &str,
        instantiation: &str,
        arch: Arch,
    ) -> Result<Arc<CompiledKernel>> {
        let key = key_text(kernel_source, instantiation, arch);
        let digest = sha256(&[key.as_bytes()]);
        let hit = memory()
            .lock()
            .expect("kernel cache lock")
            .get(&digest)
            .cloned();
        if let Some(entry) = hit
            && entry.key == key
        {
            return Ok(entry.kernel.clone());
        }
        let kernel = Arc::new(match self.read_disk(&digest, &key) {
            Some(k) => k,
            None => {
                let k = compile_kernel(kernel_source, instantiation, arch)?;
                self.write_disk(&digest, &key, &k)?;
                k
            }
        });
        let mut memory = memory().lock().expect("kernel cache lock");
        // A digest already taken by another key (which SHA-256 makes impossible in practice)
        // keeps its entry; this call still returns its own kernel.
        memory.entry(digest).or_insert_with(|| {
            Arc::new(Entry {
                key,
                kernel: kernel.clone(),
            })
        });
        Ok(kernel)
    }

    fn path(&self, digest: &Digest32) -> Option<PathBuf> {
        self.dir
            .as_ref()
            .map(|d| d.join(format!("{}.kernel", hex(digest))))
    }

    fn read_disk(&self, digest: &Digest32, key: &str) -> Option<CompiledKernel> {
        let bytes = std::fs::read(self.path(digest)?).ok()?;
        DiskEntry::decode(&bytes, key)
    }

    fn write_disk(&self, digest: &Digest32, key: &str, k: &CompiledKernel) -> Result<()> {
        let Some(path) = self.path(digest) else {
            return Ok(());
        };
        let dir = path
            .parent()
            .expect("cache file has a folder")
            .to_path_buf();
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| Error::Cache { path, source }
        };
        create_private_dir(&dir).map_err(io(&dir))?;
        // Written whole to a file of its own, then renamed over the entry: a reader sees the
        // old entry, the new one, or none, never a part.
        static WRITES: AtomicU64 = AtomicU64::new(0);
        let tmp = dir.join(format!(
            ".{}.{}.{}.tmp",
            hex(digest),
            std::process::id(),
            WRITES.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&tmp, DiskEntry::encode(key, k)).map_err(io(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io(&path)(e)
        })
    }
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// The one file of a disk entry: `FORMAT` and a newline, then the key text, the lowered name
/// and the cubin, each after its length (u64, little-endian), then the SHA-256 of all that.
struct DiskEntry;

impl DiskEntry {
    fn encode(key: &str, k: &CompiledKernel) -> Vec<u8> {
        let mut out = Vec::with_capacity(key.len() + k.cubin.len() + 256);
        out.extend_from_slice(FORMAT.as_bytes());
        out.push(b'\n');
        for part in [key.as_bytes(), k.lowered_name.as_bytes(), &k.cubin] {
            out.extend_from_slice(&(part.len() as u64).to_le_bytes());
            out.extend_from_slice(part);
        }
        let digest = sha256(&[&out]);
        out.extend_from_slice(&digest);
        out
    }

    /// The kernel of an entry that is whole (its digest holds) and was stored under `key`.
    fn decode(bytes: &[u8], key: &str) -> Option<CompiledKernel> {
        let (body, digest) = bytes.split_at_checked(bytes.len().checked_sub(32)?)?;
        if sha256(&[body]) != *digest {
            return None;
        }
        let mut rest = body.strip_prefix(FORMAT.as_bytes())?.strip_prefix(b"\n")?;
        let mut part = || -> Option<&[u8]> {
            let (len, tail) = rest.split_at_checked(8)?;
            let len = usize::try_from(u64::from_le_bytes(len.try_into().ok()?)).ok()?;
            let (part, tail) = tail.split_at_checked(len)?;
            rest = tail;
            Some(part)
        };
        let stored_key = part()?;
        let name = part()?;
        let cubin = part()?;
        if stored_key != key.as_bytes() || !rest.is_empty() {
            return None;
        }
        Some(CompiledKernel {
            cubin: cubin.to_vec(),
            lowered_name: String::from_utf8(name.to_vec()).ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel() -> CompiledKernel {
        CompiledKernel {
            cubin: vec![1, 2, 3, 4],
            lowered_name: "_Z1kv".into(),
        }
    }

    #[test]
    fn keys_differ_in_every_part() {
        let base = key_text("A", "k<1>", Arch::Sm90a);
        assert_ne!(base, key_text("B", "k<1>", Arch::Sm90a));
        assert_ne!(base, key_text("A", "k<2>", Arch::Sm90a));
        // A byte moved between the instantiation and the source changes the key too.
        assert_ne!(
            key_text("Ak", "<1>", Arch::Sm90a),
            key_text("A", "k<1>", Arch::Sm90a)
        );
        assert!(base.contains("k<1>") && base.contains(COMMON_SOURCE));
    }

    #[test]
    fn disk_entries_load_only_under_their_key() {
        let k = kernel();
        let bytes = DiskEntry::encode("key one", &k);
        let back = DiskEntry::decode(&bytes, "key one").expect("a whole entry loads");
        assert_eq!((back.cubin, back.lowered_name), (k.cubin, k.lowered_name));
        assert!(
            DiskEntry::decode(&bytes, "key two").is_none(),
            "another key"
        );
        for cut in [0, 1, 20, bytes.len() / 2, bytes.len() - 1] {
            assert!(
                DiskEntry::decode(&bytes[..cut], "key one").is_none(),
                "torn at {cut}"
            );
        }
        let mut flipped = bytes.clone();
        flipped[30] ^= 1;
        assert!(
            DiskEntry::decode(&flipped, "key one").is_none(),
            "a flipped byte"
        );
    }

    #[test]
    fn a_planted_disk_file_is_not_loaded() {
        let dir =
            std::env::temp_dir().join(format!("shapeproof-cache-test-{}", std::process::id()));
        let cache = KernelCache::with_dir(Some(dir.clone()));
        let key = key_text("src", "k<1>", Arch::Sm90a);
        let digest = sha256(&[key.as_bytes()]);
        // An entry for another key under this key's file name (what a forged file would be).
        let path = cache.path(&digest).unwrap();
        create_private_dir(&dir).unwrap();
        std::fs::write(&path, DiskEntry::encode("another key", &kernel())).unwrap();
        assert!(cache.read_disk(&digest, &key).is_none());
        // The same file written under the right key loads.
        cache.write_disk(&digest, &key, &kernel()).unwrap();
        assert_eq!(
            cache.read_disk(&digest, &key).unwrap().cubin,
            kernel().cubin
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
