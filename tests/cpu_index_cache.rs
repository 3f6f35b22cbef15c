//! The index-key cache on the CPU: the encoder keeps the format's promises (the scale is the
//! smallest power of two at or above `max(amax, 1e-4) / 448`, every value within half an e4m3
//! step of its input, NaN values ignored in the amax); the store writes the encoder's bytes at
//! each slot's two places in its page (key bytes, scale) and nothing else, skips padding, skips
//! and counts slots past the cache; the gather copies a slot's bytes and scale back exactly and
//! gives a zero row for a slot outside the cache (counted when past it); bad extents are an
//! `Err` naming the parameter.

mod common;

use common::boundary::names;
use common::index_cache::{IndexStoreScenario, PAGE, key};
use shapeproof::backend::{Backend, Cpu};
use shapeproof::dtype::{bf16, e4m3_from_f32, e4m3_to_f32};
use shapeproof::layout::{
    DeepSeekV32IndexCache, INDEX_KEY_AMAX_FLOOR, INDEX_KEY_DIM, index_key_decode, index_key_encode,
    index_key_offsets, index_key_scale_for,
};
use shapeproof::ops::index_cache::IndexKeyRows;
use shapeproof::tensor::Tensor;

#[test]
fn the_scale_is_the_smallest_power_of_two_that_fits() {
    for amax in [
        0.0f32, 1e-30, 1e-4, 0.0448, 1.0, 448.0, 448.5, 896.0, 3.0e38,
    ] {
        let s = index_key_scale_for(amax);
        let r = amax.max(INDEX_KEY_AMAX_FLOOR) / 448.0;
        assert_eq!(
            s.to_bits() & 0x007f_ffff,
            0,
            "{amax}: {s} is not a power of two"
        );
        assert!(s >= r, "{amax}: {s} < {r}");
        assert!(s / 2.0 < r, "{amax}: {s} is not the smallest");
    }
    assert_eq!(index_key_scale_for(448.0), 1.0);
    assert_eq!(index_key_scale_for(f32::INFINITY), f32::INFINITY);
}

#[test]
fn encoded_keys_keep_the_format_promises() {
    let mut rng = common::rng("encoded_keys_keep_the_format_promises");
    for kind in 0..90 {
        let k = key(&mut rng, kind);
        let (bytes, scale) = index_key_encode(k.as_slice().try_into().unwrap());
        let x: Vec<f32> = k.iter().map(|v| v.to_f32()).collect();
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert!(
            !amax.is_nan(),
            "kind {kind}: a NaN value counted in the amax"
        );
        assert_eq!(scale, index_key_scale_for(amax), "kind {kind}");
        let decoded = index_key_decode(&bytes);
        for (i, (&v, &d)) in x.iter().zip(&decoded).enumerate() {
            if v.is_nan() {
                assert_eq!(bytes[i], 0x7F, "kind {kind}: NaN encodes as 0x7F");
                continue;
            }
            // The byte is the e4m3 rounding of v / scale (exact division by a power of two).
            assert_eq!(
                bytes[i],
                e4m3_from_f32(v / scale).to_bits(),
                "kind {kind} value {i}"
            );
            let q = v / scale;
            assert!(q.abs() <= 448.0, "kind {kind}: {q} saturates");
            assert_eq!(
                d,
                e4m3_to_f32(e4m3_from_f32(q)),
                "kind {kind} value {i}: decode"
            );
            // Round to nearest: within half an e4m3 step (3 mantissa bits; subnormals 2^-9).
            let half_step = (q.abs() * 2f32.powi(-4)).max(2f32.powi(-10));
            assert!(
                (d - q).abs() <= half_step,
                "kind {kind} value {i}: {d} for {q}"
            );
        }
    }
}

#[test]
fn the_store_writes_each_slots_two_places_and_nothing_else() {
    let mut rng = common::rng("the_store_writes_each_slots_two_places_and_nothing_else");
    let s = IndexStoreScenario::new(&mut rng, 5, 250);
    let (cache, skipped) = s.run(&Cpu);
    assert_eq!(skipped, s.bad_loc());
    let mut want = s.poison.clone();
    for t in 0..s.tokens() {
        let loc = s.loc[t];
        if loc < 0 || loc as usize >= s.pages * PAGE {
            continue;
        }
        let k: &[bf16; INDEX_KEY_DIM] = s.k[t * INDEX_KEY_DIM..(t + 1) * INDEX_KEY_DIM]
            .try_into()
            .unwrap();
        let (bytes, scale) = index_key_encode(k);
        let (key_at, scale_at) = index_key_offsets::<PAGE>(loc as usize);
        want[key_at..key_at + INDEX_KEY_DIM].copy_from_slice(&bytes);
        want[scale_at..scale_at + 4].copy_from_slice(&scale.to_le_bytes());
    }
    common::index_cache::assert_same_cache("store", &cache, &want);
}

#[test]
fn no_token_leaves_the_cache_as_it_was() {
    let mut rng = common::rng("no_token_leaves_the_cache_as_it_was");
    let s = IndexStoreScenario::new(&mut rng, 2, 0);
    let (cache, skipped) = s.run(&Cpu);
    assert_eq!((cache, skipped), (s.poison.clone(), 0));
}

#[test]
fn extents_that_disagree_are_errors_naming_the_parameter() {
    let k = Tensor::<Cpu, bf16, _>::from_host(&Cpu, "k", &vec![bf16::ONE; 3 * 128], 3).unwrap();
    let loc = Tensor::from_host(&Cpu, "loc", &[0i64, 1], 2).unwrap();
    names(IndexKeyRows::new(k, loc), "loc");
    names(
        DeepSeekV32IndexCache::<Cpu>::from_buffer(Cpu.upload(&vec![0u8; 8448 * 2 - 1]).unwrap(), 2),
        "index_cache",
    );
}

#[test]
fn the_gather_copies_each_slot_back_and_zeroes_the_others() {
    let mut rng = common::rng("the_gather_copies_each_slot_back_and_zeroes_the_others");
    let s = IndexStoreScenario::new(&mut rng, 5, 250);
    let (cache, _) = s.run(&Cpu);
    let got = s.gather(&Cpu, &cache);
    assert_eq!(got.skipped, s.bad_index());
    for (i, &slot) in s.index.iter().enumerate() {
        let key = &got.k[i * INDEX_KEY_DIM..(i + 1) * INDEX_KEY_DIM];
        if slot < 0 || slot as usize >= s.pages * PAGE {
            assert!(
                key.iter().all(|&b| b == 0),
                "row {i}: slot {slot} gives zeros"
            );
            assert_eq!(got.k_scale[i], 0, "row {i}: slot {slot} gives scale 0");
            continue;
        }
        let (key_at, scale_at) = index_key_offsets::<PAGE>(slot as usize);
        assert_eq!(
            key,
            &cache[key_at..key_at + INDEX_KEY_DIM],
            "row {i}: slot {slot}"
        );
        let scale = u32::from_le_bytes(cache[scale_at..scale_at + 4].try_into().unwrap());
        assert_eq!(got.k_scale[i], scale, "row {i}: slot {slot}'s scale");
    }
}

#[test]
fn gather_extents_that_disagree_are_errors_naming_the_parameter() {
    use shapeproof::dtype::F8E4M3;
    use shapeproof::ops::index_cache::IndexKeyGather;
    let cache = DeepSeekV32IndexCache::<Cpu>::zeros(&Cpu, 1).unwrap();
    let index = Tensor::from_host(&Cpu, "index", &[0i32, 1, 2], 3).unwrap();
    let mut k = Tensor::<Cpu, F8E4M3, _>::zeros(&Cpu, 2).unwrap();
    let mut k_scale = Tensor::zeros(&Cpu, 3).unwrap();
    let gather = IndexKeyGather::<PAGE>::new();
    names(
        gather.run(&Cpu, &cache, &index, &mut k, &mut k_scale, None),
        "k",
    );
    let mut k = Tensor::<Cpu, F8E4M3, _>::zeros(&Cpu, 3).unwrap();
    let mut k_scale = Tensor::zeros(&Cpu, 4).unwrap();
    names(
        gather.run(&Cpu, &cache, &index, &mut k, &mut k_scale, None),
        "k_scale",
    );
}
