//! Top-k scenarios run identically on any backend: rows of scores drawn from one of several
//! distributions, each row's candidate range, and a selection written over a poisoned output.
//! `expected` is an independent statement of the semantics (a full sort), not the library's
//! reference code.

use rand::Rng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Normal};
use shapeproof::dim::Dim;
use shapeproof::ops::topk::{RunTopk, TopK, TopkScores};
use shapeproof::prelude::Cols;
use shapeproof::rules::IndexerTopk;
use shapeproof::tensor::Tensor;

/// How a scenario's scores are drawn.
#[derive(Clone, Copy, Debug)]
pub enum Scores {
    /// N(0, 1): distinct values, a few top digits.
    Noise,
    /// N(0, 1) with a few hundred columns lifted far above the rest.
    Peaked,
    /// Eight distinct values: the TOPK-th ties with thousands of columns.
    Ties,
    /// N(0, 1) with NaN, ±inf, -0 and +0 sprinkled in (NaN orders as -inf, -0 below +0).
    Awkward,
}

/// One call's inputs: `rows × width` scores and each row's range.
pub struct TopkScenario {
    pub width: usize,
    pub scores: Vec<f32>, // [rows, width]
    pub starts: Vec<i32>, // [rows]
    pub ends: Vec<i32>,   // [rows]
}

impl TopkScenario {
    /// `rows` rows of `width` scores; the ranges mix whole rows, sub-ranges, ranges shorter
    /// than `topk`, empty ones, and ends past the row or before the start (clamped).
    pub fn new(rng: &mut StdRng, rows: usize, width: usize, topk: usize, scores: Scores) -> Self {
        let normal = Normal::new(0.0f32, 1.0).unwrap();
        let values: Vec<f32> = (0..rows * width)
            .map(|_| match scores {
                Scores::Noise | Scores::Peaked => normal.sample(rng),
                Scores::Ties => rng.random_range(0..8) as f32 * 0.25,
                Scores::Awkward => match rng.random_range(0..40) {
                    0 => f32::NAN,
                    1 => f32::INFINITY,
                    2 => f32::NEG_INFINITY,
                    3 => -0.0,
                    4 => 0.0,
                    _ => normal.sample(rng),
                },
            })
            .collect();
        let mut values = values;
        if let Scores::Peaked = scores {
            for _ in 0..rows * 300 {
                let i = rng.random_range(0..values.len());
                values[i] += 20.0;
            }
        }
        let w = width as i32;
        let (starts, ends) = (0..rows)
            .map(|r| match r % 6 {
                0 => (0, w),
                1 => (rng.random_range(0..w / 2), rng.random_range(w / 2..=w)),
                2 => {
                    let s = rng.random_range(0..w - topk as i32);
                    (s, s + rng.random_range(1..=topk as i32)) // fewer than topk
                }
                3 => (w / 3, w / 3),                       // empty
                4 => (-5, w + 100),                        // clamped to the row
                _ => (w / 2, rng.random_range(-3..w / 2)), // end before start: empty
            })
            .unzip();
        Self {
            width,
            scores: values,
            starts,
            ends,
        }
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.starts.len()
    }

    /// The selection on `backend`, written over an output poisoned with `i32::MIN`.
    pub fn run<B: RunTopk, const TOPK: usize>(&self, backend: &B) -> Vec<i32>
    where
        Dim<TOPK>: IndexerTopk,
    {
        let rows = self.rows();
        let scores = TopkScores::new(
            Tensor::from_host(backend, "scores", &self.scores, rows * self.width).unwrap(),
            self.width,
            Tensor::from_host(backend, "starts", &self.starts, rows).unwrap(),
            Tensor::from_host(backend, "ends", &self.ends, rows).unwrap(),
        )
        .unwrap();
        let poison = vec![i32::MIN; rows * TOPK];
        let mut out =
            Tensor::<B, i32, Cols<TOPK>>::from_host(backend, "out", &poison, rows).unwrap();
        TopK::<TOPK>::new().run(backend, &scores, &mut out).unwrap();
        out.to_host(backend).unwrap()
    }

    /// Row `r` as the semantics state it: every candidate column sorted by score (NaN as
    /// -inf, -0 below +0) from the largest, ties by column; the first `topk` of them in
    /// ascending order; then -1.
    pub fn expected(&self, r: usize, topk: usize) -> Vec<i32> {
        let row = &self.scores[r * self.width..(r + 1) * self.width];
        let a = (self.starts[r].max(0) as usize).min(self.width);
        let b = (self.ends[r].max(0) as usize).clamp(a, self.width);
        let value = |c: usize| {
            let v = row[c];
            if v.is_nan() { f32::NEG_INFINITY } else { v }
        };
        let mut columns: Vec<usize> = (a..b).collect();
        columns.sort_by(|&x, &y| value(y).total_cmp(&value(x)).then(x.cmp(&y)));
        columns.truncate(topk);
        columns.sort_unstable();
        let mut out: Vec<i32> = columns.into_iter().map(|c| c as i32).collect();
        out.resize(topk, -1);
        out
    }

    /// Checks `got` (`[rows, topk]`) row by row against [`expected`](Self::expected).
    pub fn check(&self, what: &str, got: &[i32], topk: usize) {
        assert_eq!(got.len(), self.rows() * topk, "{what}: output length");
        for r in 0..self.rows() {
            let want = self.expected(r, topk);
            let row = &got[r * topk..(r + 1) * topk];
            assert_eq!(
                row,
                &want[..],
                "{what}: row {r} (range {} .. {})",
                self.starts[r],
                self.ends[r]
            );
        }
    }
}
