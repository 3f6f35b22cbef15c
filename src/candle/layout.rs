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
        let Some(split) = row_split(dims, R::COLS) else {
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

/// The `k` whose trailing dims `dims[k..]` multiply to `cols`, the shortest such suffix (all of
/// `dims` are rows when `cols` is 1), or `None`. One pass from the end: a suffix's product only
/// grows (or drops to 0 and stays there) as it lengthens.
fn row_split(dims: &[usize], cols: usize) -> Option<usize> {
    let mut suffix = 1usize; // the product of dims[k..]
    for k in (0..=dims.len()).rev() {
        if k < dims.len() {
            suffix = suffix.checked_mul(dims[k])?;
        }
        if suffix == cols {
            return Some(k);
        }
        if cols > 0 && (suffix == 0 || suffix > cols) {
            return None;
        }
    }
    None
}

/// The product of `dims`, or `None` when it overflows (a broadcast shape can claim more
/// elements than any memory holds).
pub(crate) fn product(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

#[cfg(test)]
mod tests {
    use super::{product, row_split};

    /// The one-pass split equals its definition (the largest `k` with `dims[k..]` multiplying
    /// to `cols`) on every shape of up to four dims of 0 ..= 4, for every width up to 20.
    #[test]
    fn row_split_is_the_shortest_suffix_of_the_width() {
        let mut shapes = vec![vec![]];
        for _ in 0..4 {
            let longer: Vec<Vec<usize>> = shapes
                .iter()
                .filter(|s| s.len() < 4)
                .flat_map(|s| {
                    (0..=4).map(move |d| {
                        let mut t = s.clone();
                        t.push(d);
                        t
                    })
                })
                .collect();
            shapes.extend(longer);
        }
        shapes.sort();
        shapes.dedup();
        for dims in &shapes {
            for cols in 0..=20 {
                let want = (0..=dims.len())
                    .rev()
                    .find(|&k| product(&dims[k..]) == Some(cols));
                assert_eq!(row_split(dims, cols), want, "{dims:?}, {cols}");
            }
        }
        assert_eq!(row_split(&[usize::MAX, 2], 4), None);
    }
}
