//! Element types and the MXFP8 block codec.
//!
//! bf16 is `half::bf16`, e4m3 is `float8::F8E4M3` (the type cudarc moves to the device), E8M0 is
//! [`E8M0`]. The conversions here are written out bit by bit rather than borrowed from those
//! crates so that their rounding is exactly the device's (`cvt.rn.satfinite.e4m3x2.f32`,
//! `cvt.rn.bf16.f32`) and the MXFP8 bytes of the CPU reference equal the kernel's.

pub use float8::F8E4M3;
pub use half::bf16;

/// One E8M0 scale byte: the power of two `2^(byte - 127)`; 255 is NaN and never produced.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct E8M0(pub u8);

// SAFETY: a plain byte; every bit pattern is a valid E8M0 and zero bits are valid.
unsafe impl cudarc::driver::DeviceRepr for E8M0 {}
// SAFETY: as above.
unsafe impl cudarc::driver::ValidAsZeroBits for E8M0 {}

impl E8M0 {
    /// The scale as an f32 (`2^(byte - 127)`, NaN for 255).
    pub fn to_f32(self) -> f32 {
        if self.0 == 255 {
            f32::NAN
        } else {
            pow2(self.0 as i32 - 127)
        }
    }
}

/// Elements in one MXFP8 block: one scale byte covers 32 consecutive channels of one head.
pub const MXFP8_BLOCK: usize = 32;
/// Largest finite e4m3 magnitude.
pub const E4M3_MAX: f32 = 448.0;

/// The smallest power of two at or above a positive normal `r`, taken exactly from its bits
/// (`r` itself when it is one), `+inf` for `+inf`: how the FP8 caches round a scale up so that
/// dividing by it is exact.
pub fn pow2_at_or_above(r: f32) -> f32 {
    if r.is_infinite() {
        return f32::INFINITY;
    }
    let bits = r.to_bits();
    if bits & 0x007f_ffff == 0 {
        r
    } else {
        f32::from_bits((bits & 0x7f80_0000) + 0x0080_0000)
    }
}
/// The floor of the block maximum, so that an all-zero block has a finite exponent (byte 19).
const AMAX_FLOOR: f32 = 1e-30;

/// `2^e` as an exact f32 for `-149 <= e <= 127` (subnormal below -126).
fn pow2(e: i32) -> f32 {
    if e >= -126 {
        f32::from_bits(((e + 127) as u32) << 23)
    } else {
        f32::from_bits(1u32 << (e + 149))
    }
}

/// Rounds an f32 to the nearest bf16, ties to even (NaN stays NaN), like `cvt.rn.bf16.f32`.
pub fn round_bf16(x: f32) -> bf16 {
    bf16::from_f32(x)
}

/// Rounds an f32 to bf16 and widens it back.
pub fn rn_bf16(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

/// Encodes an f32 as e4m3 ("fn" flavour: no infinities, 0x7F/0xFF NaN): round to nearest even,
/// saturate to ±448 (`cvt.rn.satfinite.e4m3x2.f32`).
pub fn e4m3_from_f32(x: f32) -> F8E4M3 {
    if x.is_nan() {
        return F8E4M3::from_bits(0x7F);
    }
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs();
    let magnitude = if a >= E4M3_MAX {
        0x7E
    } else if a < pow2(-6) {
        // Subnormal grid m·2^-9; m == 8 lands on the smallest normal, whose encoding is also 8.
        (a * 512.0).round_ties_even() as u8
    } else {
        let e = ((a.to_bits() >> 23) as i32) - 127;
        let n = (a * pow2(3 - e)).round_ties_even() as i32; // in [8, 16]
        let (e, n) = if n == 16 { (e + 1, 8) } else { (e, n) };
        (((e + 7) << 3) | (n - 8)) as u8
    };
    F8E4M3::from_bits(sign | magnitude)
}

/// Decodes an e4m3 byte exactly.
pub fn e4m3_to_f32(v: F8E4M3) -> f32 {
    let b = v.to_bits();
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = ((b >> 3) & 0xF) as i32;
    let mant = (b & 0x7) as f32;
    if exp == 15 && b & 0x7 == 7 {
        f32::NAN
    } else if exp == 0 {
        sign * mant * pow2(-9)
    } else {
        sign * (1.0 + mant / 8.0) * pow2(exp - 7)
    }
}

/// The E8M0 scale of a block whose largest magnitude is `amax`:
/// `clamp(ceil(log2(max(amax, 1e-30) / 448)) + 127, 0, 254)`, the logarithm taken exactly from
/// the bits of the f32 quotient (a fast `log2` can flip a byte near powers of two).
pub fn mxfp8_scale_for(amax: f32) -> E8M0 {
    let r = amax.max(AMAX_FLOOR) / E4M3_MAX;
    if r.is_infinite() {
        return E8M0(254);
    }
    let bits = r.to_bits();
    let field = (bits >> 23) as i32;
    let mantissa = bits & 0x7F_FFFF;
    let ceil_log2 = if field == 0 {
        // Subnormal: r = mantissa · 2^-149.
        let floor = 31 - mantissa.leading_zeros() as i32 - 149;
        if mantissa.is_power_of_two() {
            floor
        } else {
            floor + 1
        }
    } else if mantissa == 0 {
        field - 127
    } else {
        field - 126
    };
    E8M0((ceil_log2 + 127).clamp(0, 254) as u8)
}

/// Quantizes one value with a block's scale: `e4m3(clamp(x / 2^(e-127), -448, 448))`.
/// A NaN element becomes -448, as the device's fmin/fmax clamp does.
pub fn mxfp8_quantize(x: f32, scale: E8M0) -> F8E4M3 {
    let v = x / pow2(scale.0 as i32 - 127);
    // Not `clamp`: max/min drop a NaN operand (-> -448), as the device's fmaxf/fminf do.
    #[allow(clippy::manual_clamp)]
    let clamped = v.max(-E4M3_MAX).min(E4M3_MAX);
    e4m3_from_f32(clamped)
}

/// Encodes one 32-element block (docs/kernels/prologue.md §1.7): its scale byte and its e4m3 elements.
pub fn mxfp8_encode_block(block: &[f32; MXFP8_BLOCK]) -> (E8M0, [F8E4M3; MXFP8_BLOCK]) {
    let amax = block.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let scale = mxfp8_scale_for(amax);
    (scale, block.map(|x| mxfp8_quantize(x, scale)))
}

/// Decodes one MXFP8 element: `e4m3 · 2^(byte - 127)`.
pub fn mxfp8_decode(v: F8E4M3, scale: E8M0) -> f32 {
    e4m3_to_f32(v) * scale.to_f32()
}

/// Encodes a row whose length is a multiple of 32 into e4m3 data and one scale per block
/// (sglang's `to_mxfp8` on one row).
pub fn mxfp8_encode_row(row: &[f32], data: &mut [F8E4M3], scales: &mut [E8M0]) {
    debug_assert_eq!(row.len() % MXFP8_BLOCK, 0);
    for ((src, dst), scale) in row
        .chunks_exact(MXFP8_BLOCK)
        .zip(data.chunks_exact_mut(MXFP8_BLOCK))
        .zip(scales.iter_mut())
    {
        let (s, q) = mxfp8_encode_block(src.try_into().expect("32-element chunk"));
        *scale = s;
        dst.copy_from_slice(&q);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_round_trips_every_finite_byte() {
        for b in 0..=255u8 {
            let v = F8E4M3::from_bits(b);
            let f = e4m3_to_f32(v);
            if f.is_nan() {
                assert!(b & 0x7F == 0x7F);
                continue;
            }
            let back = e4m3_from_f32(f).to_bits();
            // -0 and +0 both decode to 0; keep the sign bit.
            assert_eq!(back, b, "byte {b:#04x} -> {f}");
        }
    }

    #[test]
    fn e4m3_rounds_ties_to_even_and_saturates() {
        assert_eq!(e4m3_from_f32(232.0).to_bits(), 0x76); // tie between 224 and 240 -> 224
        assert_eq!(e4m3_from_f32(248.0).to_bits(), 0x78); // tie between 240 and 256 -> 256
        assert_eq!(e4m3_from_f32(1e6).to_bits(), 0x7E);
        assert_eq!(e4m3_from_f32(-1e6).to_bits(), 0xFE);
        assert_eq!(e4m3_from_f32(f32::INFINITY).to_bits(), 0x7E);
        assert_eq!(e4m3_from_f32(2f32.powi(-10)).to_bits(), 0x00); // half of the smallest subnormal: tie to 0
        assert_eq!(e4m3_from_f32(3.0 * 2f32.powi(-10)).to_bits(), 0x02); // 1.5 ulp -> 2
    }

    #[test]
    fn zero_block_gets_scale_19() {
        let (s, q) = mxfp8_encode_block(&[0.0; 32]);
        assert_eq!(s, E8M0(19));
        assert!(q.iter().all(|v| v.to_bits() == 0));
    }

    #[test]
    fn infinity_saturates_with_scale_254_and_nan_becomes_minus_448() {
        let mut b = [1.0f32; 32];
        b[3] = f32::INFINITY;
        let (s, q) = mxfp8_encode_block(&b);
        assert_eq!(s, E8M0(254));
        assert_eq!(q[3].to_bits(), 0x7E);
        let mut b = [1.0f32; 32];
        b[5] = f32::NAN;
        let (s, q) = mxfp8_encode_block(&b);
        assert_eq!(s, mxfp8_scale_for(1.0));
        assert_eq!(q[5].to_bits(), 0xFE);
    }

    /// docs/kernels/prologue.md §1.7's worked example: q = bf16(1.5 · tau) at three positions.
    #[test]
    fn spec_worked_example_bytes() {
        for (tau, scale, byte, decoded) in [
            (1.0f32, 0x77u8, 0x7Cu8, 1.5f32),
            (1.069_314_7, 0x77, 0x7D, 1.625),
            (1.210_315_8, 0x78, 0x76, 1.75),
        ] {
            let x = rn_bf16(rn_bf16(1.5) * tau);
            let (s, q) = mxfp8_encode_block(&[x; 32]);
            assert_eq!(s, E8M0(scale), "tau {tau}");
            assert!(q.iter().all(|v| v.to_bits() == byte), "tau {tau}");
            assert_eq!(mxfp8_decode(q[0], s), decoded);
        }
    }

    #[test]
    fn block_maximum_maps_into_224_448() {
        let mut seed = 0x1234_5678u32;
        for _ in 0..10_000 {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            let amax = f32::from_bits(0x0080_0000 + seed % 0x7E00_0000);
            let s = mxfp8_scale_for(amax);
            let v = amax / s.to_f32();
            // Below the 1e-30 floor every block gets the floor's scale (byte 19).
            let floored = amax < 1e-30 && s == E8M0(19);
            assert!((224.0..=448.0).contains(&v) || floored, "{amax} {s:?} {v}");
        }
    }
}
