//! The index-key cache scenario, run the same way on any backend: keys with the awkward
//! magnitudes (zeros, negative zeros, a NaN, huge and tiny values, an amax exactly 448 times a
//! power of two and one just above), slots drawn without repeats plus padding (-1) and slots
//! past the cache, a cache poisoned with random bytes.

use rand::Rng;
use rand::rngs::StdRng;
use shapeproof::dtype::F8E4M3;
use shapeproof::dtype::bf16;
use shapeproof::layout::{DeepSeekV32IndexCache, INDEX_KEY_DIM, INDEX_KEY_ROW_BYTES};
use shapeproof::ops::counter::ErrorCounter;
use shapeproof::ops::index_cache::{IndexKeyGather, IndexKeyRows, IndexKeyStore, RunIndexCache};
use shapeproof::tensor::Tensor;

/// Tokens of a page.
pub const PAGE: usize = 64;

/// One store into a poisoned cache.
pub struct IndexStoreScenario {
    /// Pages of the cache.
    pub pages: usize,
    /// The cache's bytes before the store, `[pages, 64 · 132]`.
    pub poison: Vec<u8>,
    /// The stored keys, `[T, 128]`.
    pub k: Vec<bf16>,
    /// Each key's slot, `[T]`: distinct valid slots, some -1, some past the cache.
    pub loc: Vec<i64>,
    /// Slots the gather reads, `[n]`: valid ones (stored or not), -1 and some past the cache.
    pub index: Vec<i32>,
}

/// What one backend's gather produced.
#[derive(Debug, PartialEq)]
pub struct GatherOutcome {
    /// The gathered keys, `[n, 128]` bytes.
    pub k: Vec<u8>,
    /// Their scales' bits, `[n]`.
    pub k_scale: Vec<u32>,
    /// The skipped-slot count.
    pub skipped: u32,
}

/// A key of 128 bf16 values of the kind `kind`.
pub fn key(rng: &mut StdRng, kind: usize) -> Vec<bf16> {
    let mut v: Vec<f32> = (0..INDEX_KEY_DIM)
        .map(|_| rng.random_range(-3.0f32..3.0))
        .collect();
    match kind % 9 {
        0 => v.fill(0.0),
        1 => v.iter_mut().for_each(|x| *x = -0.0),
        2 => v[77] = f32::NAN,
        3 => v.iter_mut().for_each(|x| *x *= 1.0e30),
        4 => v.iter_mut().for_each(|x| *x *= 1.0e-30),
        // amax = 448 · 2^-3: the scale is exactly 2^-3 and the largest value encodes as 448.
        5 => {
            v.iter_mut().for_each(|x| *x = x.clamp(-50.0, 50.0));
            v[3] = 56.0;
        }
        // amax just above 448 · 2^-3: the scale doubles.
        6 => {
            v.iter_mut().for_each(|x| *x = x.clamp(-50.0, 50.0));
            v[90] = -56.25;
        }
        // Under the floor: amax below 1e-4 gets the scale of 1e-4.
        7 => v.iter_mut().for_each(|x| *x *= 1.0e-6),
        _ => {}
    }
    v.into_iter().map(bf16::from_f32).collect()
}

impl IndexStoreScenario {
    /// `tokens` keys into a cache of `pages` pages (at least `tokens` slots).
    pub fn new(rng: &mut StdRng, pages: usize, tokens: usize) -> Self {
        let slots = pages * PAGE;
        assert!(tokens <= slots);
        let poison = super::random_bytes(rng, pages * PAGE * INDEX_KEY_ROW_BYTES);
        let k: Vec<bf16> = (0..tokens).flat_map(|t| key(rng, t)).collect();
        let mut loc: Vec<i64> = super::distinct(rng, tokens, slots)
            .into_iter()
            .map(|s| s as i64)
            .collect();
        for (t, l) in loc.iter_mut().enumerate() {
            match rng.random_range(0..16) {
                0 => *l = -1,
                1 => *l = slots as i64 + rng.random_range(0..3) as i64,
                2 if t % 5 == 0 => *l = i64::MAX,
                3 if t % 3 == 0 => *l = i64::MIN,
                _ => {}
            }
        }
        let index = (0..tokens + 37)
            .map(|_| match rng.random_range(0..20) {
                0 => -1,
                1 => slots as i32 + rng.random_range(0..100),
                2 => i32::MAX,
                3 => i32::MIN,
                _ => rng.random_range(0..slots as i32),
            })
            .collect();
        Self {
            pages,
            poison,
            k,
            loc,
            index,
        }
    }

    /// Tokens stored.
    pub fn tokens(&self) -> usize {
        self.loc.len()
    }

    /// Runs the store on `backend`: the cache's bytes after it and the skipped count.
    pub fn run<B: RunIndexCache>(&self, backend: &B) -> (Vec<u8>, u32) {
        let mut cache = DeepSeekV32IndexCache::<B>::from_buffer(
            backend.upload(&self.poison).unwrap(),
            self.pages,
        )
        .unwrap();
        let rows = IndexKeyRows::new(
            Tensor::from_host(backend, "k", &self.k, self.tokens()).unwrap(),
            Tensor::from_host(backend, "loc", &self.loc, self.tokens()).unwrap(),
        )
        .unwrap();
        let mut skipped = ErrorCounter::new(backend).unwrap();
        IndexKeyStore::<PAGE>::new()
            .run(backend, &rows, &mut cache, Some(&mut skipped))
            .unwrap();
        (
            cache.bytes().to_host(backend).unwrap(),
            skipped.read(backend).unwrap(),
        )
    }

    /// Gathers `index` on `backend` from a cache holding `bytes`, into poisoned outputs.
    pub fn gather<B: RunIndexCache>(&self, backend: &B, bytes: &[u8]) -> GatherOutcome {
        let cache =
            DeepSeekV32IndexCache::<B>::from_buffer(backend.upload(bytes).unwrap(), self.pages)
                .unwrap();
        let n = self.index.len();
        let index = Tensor::from_host(backend, "index", &self.index, n).unwrap();
        let mut k =
            Tensor::from_host(backend, "k", &vec![F8E4M3::from_bits(0x5A); n * 128], n).unwrap();
        let mut k_scale = Tensor::from_host(backend, "k_scale", &vec![f32::NAN; n], n).unwrap();
        let mut skipped = ErrorCounter::new(backend).unwrap();
        IndexKeyGather::<PAGE>::new()
            .run(
                backend,
                &cache,
                &index,
                &mut k,
                &mut k_scale,
                Some(&mut skipped),
            )
            .unwrap();
        GatherOutcome {
            k: k.to_host(backend)
                .unwrap()
                .iter()
                .map(|b| b.to_bits())
                .collect(),
            k_scale: k_scale
                .to_host(backend)
                .unwrap()
                .iter()
                .map(|s| s.to_bits())
                .collect(),
            skipped: skipped.read(backend).unwrap(),
        }
    }

    /// Slots past the cache among `index` (what the gather must count).
    pub fn bad_index(&self) -> u32 {
        let slots = (self.pages * PAGE) as i64;
        self.index.iter().filter(|&&s| s as i64 >= slots).count() as u32
    }

    /// Slots past the cache among `loc` (what the store must count).
    pub fn bad_loc(&self) -> u32 {
        let slots = (self.pages * PAGE) as i64;
        self.loc.iter().filter(|&&l| l >= slots).count() as u32
    }
}

/// Compares two caches byte for byte, naming the first page and byte that differ.
pub fn assert_same_cache(what: &str, got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len(), "{what}: cache sizes");
    if let Some(at) = got.iter().zip(want).position(|(a, b)| a != b) {
        let page_bytes = PAGE * INDEX_KEY_ROW_BYTES;
        panic!(
            "{what}: cache differs first at page {} byte {} ({:#04x} != {:#04x})",
            at / page_bytes,
            at % page_bytes,
            got[at],
            want[at]
        );
    }
}
