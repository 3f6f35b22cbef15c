//! The one error type of the runtime boundary.
//!
//! Static facts never get here: they are types. What remains is what the batch decides (extents
//! of the caller's buffers, lengths of index arrays) and what the machine decides (no driver, a
//! failed compilation or launch). Each variant names the parameter and both values.

/// Every failure the library reports at run time.
///
/// `Debug` prints the same sentence as `Display` (what `fn main() -> shapeproof::Result<()>`
/// shows for an error it returns); match on the variants for the fields.
#[derive(thiserror::Error)]
pub enum Error {
    /// A buffer's extent disagrees with the extent the rest of the call fixes.
    #[error("`{param}`: expected {expected} {what}, got {actual}")]
    Extent {
        /// The argument, as the caller knows it (`"loc"`, `"k_inter"`).
        param: &'static str,
        /// What was counted (`"elements"`, `"tokens"`, `"rows"`).
        what: &'static str,
        /// The extent the call requires.
        expected: usize,
        /// The extent the caller passed.
        actual: usize,
    },
    /// A buffer does not hold the `rows × cols` elements its row shape and row count fix.
    #[error("`{param}`: expected {rows} rows of {cols} = {} elements, got {actual}{}", rows * cols, RowsOf(*rows, *cols, *actual))]
    Rows {
        /// The argument.
        param: &'static str,
        /// The row count the caller gave (or the call fixes).
        rows: usize,
        /// Elements per row, fixed by the tensor's type.
        cols: usize,
        /// Elements the buffer holds.
        actual: usize,
    },
    /// A runtime value lies outside the range the kernel accepts.
    #[error("`{param}`: {value} is outside {range}")]
    Value {
        /// The argument.
        param: &'static str,
        /// The value passed (wide enough for every `usize`, `i64` and `u64` argument, exactly).
        value: i128,
        /// The accepted range, written for a person (`"1 ..= 64"`).
        range: String,
    },
    /// A value handed over at the boundary (a foreign tensor's dtype, device, layout or shape)
    /// is not what the kernel takes.
    #[error("`{param}`: expected {expected}, got {actual}")]
    Mismatch {
        /// The argument.
        param: &'static str,
        /// What the call requires, written for a person.
        expected: String,
        /// What the caller passed.
        actual: String,
    },
    /// The backend could not allocate a buffer of the requested size.
    #[error("cannot allocate {elements} elements of {element_bytes} bytes")]
    Alloc {
        /// Elements asked for.
        elements: usize,
        /// Bytes per element.
        element_bytes: usize,
    },
    /// A buffer cannot be used by the backend it was passed to.
    #[error("`{param}`: the buffer cannot be used by this backend: {reason}")]
    ForeignBuffer {
        /// The argument.
        param: &'static str,
        /// Why not.
        reason: &'static str,
    },
    /// The backend's stream cannot take the work now: a per-thread default stream used from
    /// another thread, a stream being captured into a graph outside [`crate::backend::cuda::GraphRecorder`].
    #[error("the stream {stream} cannot take this work: {reason}")]
    Stream {
        /// The stream, as CUDA names it.
        stream: String,
        /// Why not, and what to do instead.
        reason: &'static str,
    },
    /// A CUDA graph could not be recorded or replayed.
    #[error("CUDA graph: {reason}")]
    Graph {
        /// What went wrong.
        reason: &'static str,
    },
    /// No CUDA driver library could be loaded: there is no GPU backend on this machine.
    #[error("CUDA driver library (libcuda.so) not found: no GPU backend on this machine")]
    NoDriver,
    /// The NVRTC library (libnvrtc.so.13) could not be loaded.
    #[error(
        "NVRTC library (libnvrtc.so.13) not found: set LD_LIBRARY_PATH to a CUDA 13 toolkit's lib64, or install the nvidia-cuda-nvrtc==13.0.88 wheel"
    )]
    NoNvrtc,
    /// The device is not one the kernels are built for.
    #[error(
        "device `{name}` has compute capability {major}.{minor}; the kernels need 9.0 (sm_90a)"
    )]
    UnsupportedDevice {
        /// The device name.
        name: String,
        /// Compute capability, major.
        major: i32,
        /// Compute capability, minor.
        minor: i32,
    },
    /// NVRTC rejected a kernel instantiation.
    #[error("NVRTC failed to compile `{instantiation}`:\n{log}")]
    Compile {
        /// The template instantiation.
        instantiation: String,
        /// The compiler's log.
        log: String,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    /// Reading or writing the on-disk kernel cache failed.
    #[error("kernel cache at `{path}`: {source}")]
    Cache {
        /// The file or folder.
        path: std::path::PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
}

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// `rows × cols` elements, or an [`Error::Value`] naming `param` when the product does not
    /// fit in `usize` (a row count no allocation could hold).
    #[inline]
    pub fn elements(param: &'static str, rows: usize, cols: usize) -> Result<usize> {
        match rows.checked_mul(cols) {
            Some(n) => Ok(n),
            None => Err(Self::too_many_elements(param, rows, cols)),
        }
    }

    #[cold]
    #[inline(never)]
    fn too_many_elements(param: &'static str, rows: usize, cols: usize) -> Self {
        Error::Value {
            param,
            value: rows as i128,
            range: format!(
                "rows with rows × {cols} elements addressable (0 ..= {})",
                usize::MAX / cols.max(1)
            ),
        }
    }

    /// Checks that a buffer of `actual` elements is `rows` rows of `cols`: `Ok`, or an
    /// [`Error::Rows`] (an [`Error::Value`] when `rows × cols` overflows).
    #[inline]
    pub fn check_rows(param: &'static str, rows: usize, cols: usize, actual: usize) -> Result<()> {
        if rows.checked_mul(cols) == Some(actual) {
            return Ok(());
        }
        Err(Self::rows_mismatch(param, rows, cols, actual))
    }

    #[cold]
    #[inline(never)]
    fn rows_mismatch(param: &'static str, rows: usize, cols: usize, actual: usize) -> Self {
        match Self::elements(param, rows, cols) {
            Err(e) => e,
            Ok(_) => Error::Rows {
                param,
                rows,
                cols,
                actual,
            },
        }
    }

    /// `value` as the `i32` a kernel counts rows or indices in: `Ok`, or an [`Error::Value`]
    /// naming `param` with the range `0 ..= i32::MAX`.
    pub fn to_i32(param: &'static str, value: usize) -> Result<i32> {
        i32::try_from(value).map_err(|_| Error::Value {
            param,
            value: value as i128,
            range: format!("0 ..= {}", i32::MAX),
        })
    }

    /// Checks that `value` times `factor` fits the `i32` a kernel counts it in (`value ≤
    /// i32::MAX / factor`): `Ok`, or an [`Error::Value`] naming `param`, with the range and the
    /// product it bounds (`"0 ..= 134217727 (rows × 16 within i32)"`).
    #[inline]
    pub fn check_i32_product(param: &'static str, value: usize, factor: usize) -> Result<()> {
        let most = i32::MAX as usize / factor.max(1);
        if value > most {
            return Err(Self::i32_product_overflow(param, value, factor, most));
        }
        Ok(())
    }

    #[cold]
    #[inline(never)]
    fn i32_product_overflow(param: &'static str, value: usize, factor: usize, most: usize) -> Self {
        Error::Value {
            param,
            value: value as i128,
            range: format!("0 ..= {most} ({param} × {factor} within i32)"),
        }
    }

    /// Checks one extent: `Ok` when `actual == expected`, otherwise an [`Error::Extent`].
    #[inline]
    pub fn check_extent(
        param: &'static str,
        what: &'static str,
        expected: usize,
        actual: usize,
    ) -> Result<()> {
        if expected == actual {
            return Ok(());
        }
        Err(Self::extent_mismatch(param, what, expected, actual))
    }

    #[cold]
    #[inline(never)]
    fn extent_mismatch(
        param: &'static str,
        what: &'static str,
        expected: usize,
        actual: usize,
    ) -> Self {
        Error::Extent {
            param,
            what,
            expected,
            actual,
        }
    }
}

/// The tail of an [`Error::Rows`] sentence: what the buffer would be as rows of the same count
/// (`" (2 rows of 100)"`), which is how a row width that was padded shows itself.
struct RowsOf(usize, usize, usize);

impl std::fmt::Display for RowsOf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let RowsOf(rows, cols, actual) = *self;
        if rows > 0 && actual % rows == 0 && actual / rows != cols {
            write!(f, " ({rows} rows of {})", actual / rows)
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Error;

    /// What `fn main() -> shapeproof::Result<()>` prints for a returned error is the sentence.
    #[test]
    fn debug_reads_like_display() {
        let e = Error::Extent {
            param: "loc",
            what: "elements",
            expected: 12,
            actual: 11,
        };
        assert_eq!(format!("{e:?}"), "`loc`: expected 12 elements, got 11");
        assert_eq!(format!("{e:?}"), e.to_string());
    }

    /// A row-shape error gives the rows and their width, and the width the buffer would have.
    #[test]
    fn rows_error_shows_the_width_it_got() {
        let e = Error::check_rows("indices", 2, 128, 200).unwrap_err();
        assert_eq!(
            e.to_string(),
            "`indices`: expected 2 rows of 128 = 256 elements, got 200 (2 rows of 100)"
        );
        let e = Error::check_rows("k_out", 3, 4, 10).unwrap_err();
        assert_eq!(
            e.to_string(),
            "`k_out`: expected 3 rows of 4 = 12 elements, got 10"
        );
        assert!(Error::check_rows("q", 0, 4, 0).is_ok());
        assert!(matches!(
            Error::check_rows("q", usize::MAX, 2, 0),
            Err(Error::Value { .. })
        ));
    }
}
