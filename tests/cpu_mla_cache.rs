//! The FP8 sparse MLA cache on the CPU: the encoder keeps the format's promises (the scale is
//! the smallest power of two at or above `max(amax / 448, 2^-13)`, every value within half an
//! e4m3 step of its input, RoPE bit for bit); the store writes the encoder's bytes at its slots
//! and nothing else, skips and counts slots past the cache; the gather re-casts exactly and
//! zeroes rows without a slot; bad extents are an `Err` naming the parameter.

mod common;

use common::boundary::names;
use common::mla_cache::{CacheScenario, PAGE};
use shapeproof::backend::Cpu;
use shapeproof::dtype::{F8E4M3, bf16, e4m3_from_f32, e4m3_to_f32};
use shapeproof::layout::{
    DeepSeekV32KvCache, MLA_CACHE_DIM, MLA_FP8_ROW_BYTES, MLA_MIN_SCALE, MlaLatentKv,
    mla_fp8_decode_row, mla_fp8_encode_row, mla_fp8_scale_for,
};
use shapeproof::ops::mla_cache::{MlaCacheGather, MlaKvRows};
use shapeproof::tensor::Tensor;

fn encode(row: &[bf16]) -> [u8; MLA_FP8_ROW_BYTES] {
    let mut out = [0u8; MLA_FP8_ROW_BYTES];
    mla_fp8_encode_row(row.try_into().unwrap(), &mut out);
    out
}

#[test]
fn the_scale_is_the_smallest_power_of_two_that_fits() {
    for amax in [
        0.0f32, 1e-30, 0.0448, 0.04480001, 1.0, 448.0, 448.5, 896.0, 3.0e38,
    ] {
        let s = mla_fp8_scale_for(amax);
        let r = (amax / 448.0).max(MLA_MIN_SCALE);
        assert_eq!(
            s.to_bits() & 0x007f_ffff,
            0,
            "{amax}: {s} is not a power of two"
        );
        assert!(s >= r, "{amax}: {s} < {r}");
        assert!(s / 2.0 < r, "{amax}: {s} is not the smallest");
    }
    assert_eq!(mla_fp8_scale_for(0.0), 1.0 / 8192.0);
    assert_eq!(mla_fp8_scale_for(448.0), 1.0);
    assert_eq!(mla_fp8_scale_for(448.5), 2.0);
    assert_eq!(mla_fp8_scale_for(f32::INFINITY), f32::INFINITY);
}

#[test]
fn encoded_rows_keep_the_format_promises() {
    let mut rng = common::rng("encoded_rows_keep_the_format_promises");
    let s = CacheScenario::new(&mut rng, 2, 100, 0);
    for t in 0..s.tokens() {
        let row = &s.kv[t * MLA_CACHE_DIM..(t + 1) * MLA_CACHE_DIM];
        let bytes = encode(row);
        let decoded = mla_fp8_decode_row(&bytes);
        for g in 0..4 {
            let x: Vec<f32> = row[g * 128..(g + 1) * 128]
                .iter()
                .map(|v| v.to_f32())
                .collect();
            let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let scale = f32::from_le_bytes(bytes[512 + 4 * g..516 + 4 * g].try_into().unwrap());
            assert_eq!(scale, mla_fp8_scale_for(amax), "token {t} group {g}");
            for (i, &v) in x.iter().enumerate() {
                let c = g * 128 + i;
                let d = decoded[c];
                if v.is_nan() {
                    assert!(d.is_nan(), "token {t} channel {c}: NaN must stay NaN");
                    continue;
                }
                // Half an e4m3 step: 2^-4 relative for normals, scale · 2^-10 near zero.
                let bound = (v.abs() / 16.0).max(scale / 1024.0);
                assert!(
                    (d - v).abs() <= bound,
                    "token {t} channel {c}: {v} decodes to {d} (bound {bound})"
                );
                assert_eq!(d.is_sign_negative(), v.is_sign_negative(), "sign of {v}");
            }
        }
        for c in 512..MLA_CACHE_DIM {
            assert_eq!(decoded[c].to_bits(), row[c].to_f32().to_bits(), "RoPE {c}");
        }
    }
}

#[test]
fn the_store_writes_its_slots_and_nothing_else() {
    let mut rng = common::rng("the_store_writes_its_slots_and_nothing_else");
    let s = CacheScenario::new(&mut rng, 5, 250, 0);
    let out = s.run(&Cpu);
    let slots = s.pages * PAGE;
    let mut stored = vec![None; slots];
    for (t, &l) in s.loc.iter().enumerate() {
        if (0..slots as i64).contains(&l) {
            stored[l as usize] = Some(t);
        }
    }
    for (slot, token) in stored.iter().enumerate() {
        let got = &out.cache[slot * MLA_FP8_ROW_BYTES..(slot + 1) * MLA_FP8_ROW_BYTES];
        match token {
            Some(t) => assert_eq!(
                got,
                &encode(&s.kv[t * MLA_CACHE_DIM..(t + 1) * MLA_CACHE_DIM])[..],
                "slot {slot} (token {t})"
            ),
            None => assert_eq!(
                got,
                &s.poison[slot * MLA_FP8_ROW_BYTES..(slot + 1) * MLA_FP8_ROW_BYTES],
                "slot {slot} is named by no token and changed"
            ),
        }
    }
    assert!(
        s.bad_loc() > 0,
        "the scenario must hold slots past the cache"
    );
    assert_eq!(out.store_skipped, s.bad_loc());
}

#[test]
fn the_gather_recasts_exactly_and_zeroes_rows_without_a_slot() {
    let mut rng = common::rng("the_gather_recasts_exactly_and_zeroes_rows_without_a_slot");
    let s = CacheScenario::new(&mut rng, 3, 150, 400);
    let out = s.run(&Cpu);
    let slots = s.pages * PAGE;
    for (r, &slot) in s.index.iter().enumerate() {
        let got = &out.workspace[r * MLA_CACHE_DIM..(r + 1) * MLA_CACHE_DIM];
        if !(0..slots as i32).contains(&slot) {
            assert!(
                got.iter().all(|&b| b == 0),
                "row {r} (slot {slot}) not zero"
            );
            continue;
        }
        let slot = slot as usize;
        let bytes: &[u8; MLA_FP8_ROW_BYTES] = out.cache
            [slot * MLA_FP8_ROW_BYTES..(slot + 1) * MLA_FP8_ROW_BYTES]
            .try_into()
            .unwrap();
        let decoded = mla_fp8_decode_row(bytes);
        for c in 0..MLA_CACHE_DIM {
            let v = e4m3_to_f32(F8E4M3::from_bits(got[c]));
            let want = e4m3_to_f32(e4m3_from_f32(decoded[c]));
            assert!(
                v.to_bits() == want.to_bits() || (v.is_nan() && want.is_nan()),
                "row {r} channel {c}: {v} != {want}"
            );
        }
    }
    assert!(
        s.bad_index() > 0,
        "the scenario must hold slots past the cache"
    );
    assert_eq!(out.gather_skipped, s.bad_index());
    assert_eq!(
        out.workspace_scale, 1.0,
        "the gather sets the workspace scale"
    );
}

#[test]
fn a_store_then_a_gather_is_close_to_the_rows() {
    // The round trip loses what e4m3 loses twice (once under the group scale, once under the
    // identity scale of the workspace): for values of magnitude ≥ 2^-6 (e4m3 normals) within
    // two half-steps, 2^-3 relative.
    let mut rng = common::rng("a_store_then_a_gather_is_close_to_the_rows");
    let mut s = CacheScenario::new(&mut rng, 2, 128, 0);
    s.loc = (0..128).collect();
    s.index = (0..128).collect();
    s.kv = common::bf16_normal(&mut rng, 128 * MLA_CACHE_DIM, 0.0, 1.0);
    let out = s.run(&Cpu);
    assert_eq!((out.store_skipped, out.gather_skipped), (0, 0));
    for (i, (&b, x)) in out.workspace.iter().zip(&s.kv).enumerate() {
        let (v, x) = (e4m3_to_f32(F8E4M3::from_bits(b)), x.to_f32());
        if x.abs() >= 1.0 / 64.0 {
            assert!((v - x).abs() <= x.abs() / 8.0, "element {i}: {x} -> {v}");
        }
    }
}

#[test]
fn bad_extents_name_the_parameter() {
    let rows = MlaKvRows::new(
        Tensor::<Cpu, bf16, _>::zeros(&Cpu, 3).unwrap(),
        Tensor::<Cpu, i64, _>::zeros(&Cpu, 4).unwrap(),
    );
    names(rows, "loc");

    let cache = DeepSeekV32KvCache::<Cpu>::zeros(&Cpu, 1).unwrap();
    let index = Tensor::<Cpu, i32, _>::zeros(&Cpu, 5).unwrap();
    let mut workspace =
        MlaLatentKv::<Cpu, 576>::new(&Cpu, vec![F8E4M3::default(); 4 * 576], 4, 1.0).unwrap();
    names(
        MlaCacheGather::<64, 128>::new().run(&Cpu, &cache, &index, &mut workspace, None),
        "workspace",
    );
    names(
        DeepSeekV32KvCache::<Cpu>::from_buffer(vec![0u8; 64 * 656 + 1], 1),
        "kv_cache",
    );
}
