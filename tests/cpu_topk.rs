//! The top-k on the CPU reference: every row equals the semantics stated as a full sort (NaN as
//! -inf, -0 below +0, ties to the lower column, ascending, then -1) over scores of every kind
//! and ranges of every kind, and extents that disagree are errors naming the parameter.

mod common;

use common::topk::{Scores, TopkScenario};
use shapeproof::Error;
use shapeproof::backend::Cpu;
use shapeproof::ops::topk::{TopK, TopkScores, select_row};
use shapeproof::prelude::Cols;
use shapeproof::tensor::Tensor;

#[test]
fn every_row_is_the_sorted_selection() {
    for scores in [Scores::Noise, Scores::Peaked, Scores::Ties, Scores::Awkward] {
        let what = format!("{scores:?}");
        let mut rng = common::rng(&what);
        let s = TopkScenario::new(&mut rng, 12, 3000, 128, scores);
        s.check(&format!("{what} top-128"), &s.run::<Cpu, 128>(&Cpu), 128);
        let s = TopkScenario::new(&mut rng, 6, 5000, 512, scores);
        s.check(&format!("{what} top-512"), &s.run::<Cpu, 512>(&Cpu), 512);
    }
}

/// The parameter an `Err` names.
fn param_of(e: Error) -> &'static str {
    match e {
        Error::Extent { param, .. } | Error::Value { param, .. } => param,
        other => panic!("unexpected error {other:?}"),
    }
}

#[test]
fn extents_that_disagree_are_errors_naming_the_parameter() {
    let t = |name, n| Tensor::<Cpu, i32, _>::zeros(&Cpu, n).map_err(|e| panic!("{name}: {e}"));
    let scores = |n| Tensor::<Cpu, f32, _>::zeros(&Cpu, n).unwrap();
    // scores of another size than rows × width
    let e = TopkScores::new(scores(99), 10, t("s", 10).unwrap(), t("e", 10).unwrap());
    assert_eq!(param_of(e.err().unwrap()), "scores");
    // ends of another row count than starts
    let e = TopkScores::new(scores(100), 10, t("s", 10).unwrap(), t("e", 9).unwrap());
    assert_eq!(param_of(e.err().unwrap()), "ends");
    // a width the i32 columns cannot address
    let e = TopkScores::new(scores(0), 1 << 31, t("s", 0).unwrap(), t("e", 0).unwrap());
    assert_eq!(param_of(e.err().unwrap()), "width");
    // indices of another row count
    let ends = Tensor::<Cpu, i32, _>::filled(&Cpu, 10, 10).unwrap();
    let ok = TopkScores::new(scores(100), 10, t("s", 10).unwrap(), ends).unwrap();
    let mut indices = Tensor::<Cpu, i32, Cols<128>>::zeros(&Cpu, 11).unwrap();
    let e = TopK::<128>::new().run(&Cpu, &ok, &mut indices);
    assert_eq!(param_of(e.err().unwrap()), "indices");
    // and the matching call runs: ten tied candidates a row, all kept, then -1
    let mut indices = Tensor::<Cpu, i32, Cols<128>>::zeros(&Cpu, 10).unwrap();
    TopK::<128>::new().run(&Cpu, &ok, &mut indices).unwrap();
    let want: Vec<i32> = (0..128).map(|c| if c < 10 { c } else { -1 }).collect();
    for row in indices.to_host(&Cpu).unwrap().chunks(128) {
        assert_eq!(row, &want[..]);
    }
}

#[test]
fn the_public_row_selection_takes_any_range_and_width() {
    let row = [3.0, f32::NAN, -0.0, 0.0, 3.0, f32::NEG_INFINITY, 1.0];
    assert_eq!(select_row(&row, 0, 7, 0), Vec::<i32>::new());
    assert_eq!(select_row(&row, 0, 7, 3), vec![0, 4, 6]);
    assert_eq!(select_row(&row, 1, 4, 2), vec![2, 3]); // NaN (as -inf) loses to both zeros
    assert_eq!(
        select_row(&row, i32::MIN, i32::MAX, 7),
        vec![0, 1, 2, 3, 4, 5, 6]
    );
    assert_eq!(select_row(&row, 5, 2, 4), Vec::<i32>::new());
    assert_eq!(select_row(&[], -1, 1, 4), Vec::<i32>::new());
}
