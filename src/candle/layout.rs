//! The checks a candle tensor passes before it is lent as rows of a shapeproof tensor.

use std::ops::Range;

use candle_core::{DType, Layout};

use super::element::CandleElement;
use crate::error::{Error, Result};
use crate::tensor::RowShape;

/// An `Err` naming `param`, what was expected and what was found.
pub(crate) fn mismatch(
    param: &'static str,
    expected: impl Into<String>,
    actual: impl Into<String>,
) -> Error {
    Error::Mismatch {
        param,
        expected: expected.into(),
        actual: actual.into(),
    }
}

/// Where a checked candle tensor lies in its storage, and how many rows of `R` it holds.
pub(crate) struct Rows {
    /// The storage elements the tensor covers.
    pub(crate) range: Range<usize>,
    /// Rows of `R::COLS` elements.
    pub(crate) rows: usize,
}

impl Rows {
    /// Checks dtype, contiguity and trailing shape of a tensor of `dtype` laid out as
    /// `layout`, and that it lies inside a storage of `storage_len` elements.
    pub(crate) fn check<T: CandleElement, R: RowShape>(
        param: &'static str,
        dtype: DType,
        layout: &Layout,
        storage_len: usize,
    ) -> Result<Self> {
        if !T::accepts(dtype) {
            return Err(mismatch(param, T::EXPECTED, format!("{dtype:?}")));
        }
        if !layout.is_contiguous() {
            return Err(mismatch(
                param,
                "a contiguous tensor",
                format!(
                    "strides {:?} for shape {:?}",
                    layout.stride(),
                    layout.dims()
                ),
            ));
        }
        // Rows are the leading dims, a row the trailing dims whose product is `R::COLS`
        // (`[T, HQ, 4]` and `[T, HQ·4]` are both rows of `HQ·4` scales; `[HD]` is one row).
        let dims = layout.dims();
        let split = (0..=dims.len())
            .rev()
            .find(|&k| product(&dims[k..]) == Some(R::COLS));
        let Some(split) = split else {
            return Err(mismatch(
                param,
                format!(
                    "rows of {} elements (trailing dims multiplying to {})",
                    R::COLS,
                    R::COLS
                ),
                format!("shape {dims:?}"),
            ));
        };
        let rows = product(&dims[..split]).ok_or_else(|| {
            mismatch(
                param,
                "a shape whose element count fits in usize",
                format!("{dims:?}"),
            )
        })?;
        let len = Error::elements(param, rows, R::COLS)?;
        let start = layout.start_offset();
        match start.checked_add(len) {
            Some(end) if end <= storage_len => Ok(Rows {
                range: start..end,
                rows,
            }),
            _ => Err(mismatch(
                param,
                format!("{len} elements from {start}"),
                format!("a storage of {storage_len}"),
            )),
        }
    }
}

/// The product of `dims`, or `None` when it overflows (a broadcast shape can claim more
/// elements than any memory holds).
pub(crate) fn product(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}
