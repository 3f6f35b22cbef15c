//! The FP8 sparse MLA cache scenario, run the same way on any backend: rows with the awkward
//! groups (zeros, negative zeros, a NaN, huge and tiny magnitudes, an amax exactly 448 times a
//! power of two and one just above), slots drawn without repeats plus padding (-1) and slots
//! past the cache, a cache poisoned with random bytes, a workspace poisoned before the gather.

use rand::Rng;
use rand::rngs::StdRng;
use shapeproof::dtype::{F8E4M3, bf16};
use shapeproof::layout::{DeepSeekV32KvCache, MLA_CACHE_DIM, MLA_FP8_ROW_BYTES, MlaLatentKv};
use shapeproof::ops::mla_cache::{MlaCacheGather, MlaCacheStore, MlaKvRows};
use shapeproof::ops::prologue::ErrorCounter;
use shapeproof::tensor::Tensor;

/// Tokens of a page.
pub const PAGE: usize = 64;

/// One store and one gather over a poisoned cache.
pub struct CacheScenario {
    /// Pages of the cache.
    pub pages: usize,
    /// The cache's bytes before the store, `[pages · 64, 656]`.
    pub poison: Vec<u8>,
    /// The stored rows, `[T, 576]`.
    pub kv: Vec<bf16>,
    /// Each row's slot, `[T]`: distinct valid slots, some -1, some past the cache.
    pub loc: Vec<i64>,
    /// Slots the gather reads, `[n]`: valid ones (stored or not), -1 and some past the cache.
    pub index: Vec<i32>,
}

/// What one backend produced.
#[derive(Debug, PartialEq)]
pub struct CacheOutcome {
    /// The cache after the store, `[slots, 656]`.
    pub cache: Vec<u8>,
    /// The store's skipped-slot count.
    pub store_skipped: u32,
    /// The gathered workspace, `[n, 576]` e4m3 bytes.
    pub workspace: Vec<u8>,
    /// The workspace's scale after the gather.
    pub workspace_scale: f32,
    /// The gather's skipped-slot count.
    pub gather_skipped: u32,
}

/// A row of 576 bf16 values whose latent groups are chosen by `kind`.
fn row(rng: &mut StdRng, kind: usize) -> Vec<bf16> {
    let mut v: Vec<f32> = (0..MLA_CACHE_DIM)
        .map(|_| rng.random_range(-2.0f32..2.0))
        .collect();
    let group = kind % 4;
    let g = &mut v[group * 128..(group + 1) * 128];
    match kind % 9 {
        0 => g.fill(0.0),
        1 => g.iter_mut().for_each(|x| *x = -0.0),
        2 => g[17] = f32::NAN,
        3 => g.iter_mut().for_each(|x| *x *= 1.0e30),
        4 => g.iter_mut().for_each(|x| *x *= 1.0e-30),
        // amax = 448 · 2^-3: the scale is exactly 2^-3 and the largest value encodes as 448.
        5 => {
            g.iter_mut().for_each(|x| *x = x.clamp(-50.0, 50.0));
            g[3] = 56.0;
        }
        // amax just above 448 · 2^-3: the scale doubles.
        6 => {
            g.iter_mut().for_each(|x| *x = x.clamp(-50.0, 50.0));
            g[90] = -56.25;
        }
        // Values under the smallest scale's reach: e4m3 subnormals of 2^-13.
        7 => g.iter_mut().for_each(|x| *x *= 1.0e-5),
        _ => {}
    }
    v.into_iter().map(bf16::from_f32).collect()
}

impl CacheScenario {
    /// `tokens` rows into a cache of `pages` pages (at least `tokens` slots), and a gather of
    /// `gathered` rows.
    pub fn new(rng: &mut StdRng, pages: usize, tokens: usize, gathered: usize) -> Self {
        let slots = pages * PAGE;
        assert!(tokens <= slots);
        let poison = super::random_bytes(rng, slots * MLA_FP8_ROW_BYTES);
        let kv: Vec<bf16> = (0..tokens).flat_map(|t| row(rng, t)).collect();
        let mut loc: Vec<i64> = super::distinct(rng, tokens, slots)
            .into_iter()
            .map(|s| s as i64)
            .collect();
        // Padding and slots past the cache, at random tokens.
        for (t, l) in loc.iter_mut().enumerate() {
            match rng.random_range(0..16) {
                0 => *l = -1,
                1 => *l = slots as i64 + rng.random_range(0..3) as i64,
                2 if t % 5 == 0 => *l = i64::MAX,
                _ => {}
            }
        }
        let index = (0..gathered)
            .map(|_| match rng.random_range(0..20) {
                0 => -1,
                1 => slots as i32 + rng.random_range(0..100),
                2 => i32::MAX,
                _ => rng.random_range(0..slots as i32),
            })
            .collect();
        Self {
            pages,
            poison,
            kv,
            loc,
            index,
        }
    }

    /// Tokens stored.
    pub fn tokens(&self) -> usize {
        self.loc.len()
    }

    /// Runs the store, then the gather over the stored cache, on `backend`.
    pub fn run<B: shapeproof::ops::mla_cache::RunMlaCache>(&self, backend: &B) -> CacheOutcome {
        let mut cache =
            DeepSeekV32KvCache::<B>::from_buffer(backend.upload(&self.poison).unwrap(), self.pages)
                .unwrap();
        let rows = MlaKvRows::new(
            Tensor::from_host(backend, "kv", &self.kv, self.tokens()).unwrap(),
            Tensor::from_host(backend, "loc", &self.loc, self.tokens()).unwrap(),
        )
        .unwrap();
        let mut skipped = ErrorCounter::new(backend).unwrap();
        MlaCacheStore::<64, 128>::new()
            .run(backend, &rows, &mut cache, Some(&mut skipped))
            .unwrap();
        let store_skipped = skipped.read(backend).unwrap();

        let n = self.index.len();
        let index = Tensor::from_host(backend, "index", &self.index, n).unwrap();
        let poison = vec![F8E4M3::from_bits(0x5A); n * MLA_CACHE_DIM];
        let mut workspace =
            MlaLatentKv::<B, MLA_CACHE_DIM>::new(backend, backend.upload(&poison).unwrap(), n, 7.0)
                .unwrap();
        skipped.reset(backend).unwrap();
        MlaCacheGather::<64, 128>::new()
            .run(backend, &cache, &index, &mut workspace, Some(&mut skipped))
            .unwrap();
        CacheOutcome {
            cache: cache.bytes().to_host(backend).unwrap(),
            store_skipped,
            workspace: workspace
                .data()
                .to_host(backend)
                .unwrap()
                .iter()
                .map(|b| b.to_bits())
                .collect(),
            workspace_scale: workspace.scale().to_host(backend).unwrap()[0],
            gather_skipped: skipped.read(backend).unwrap(),
        }
    }

    /// Slots past the cache among `loc` (what the store must count).
    pub fn bad_loc(&self) -> u32 {
        let slots = (self.pages * PAGE) as i64;
        self.loc.iter().filter(|&&l| l >= slots).count() as u32
    }

    /// Slots past the cache among `index` (what the gather must count).
    pub fn bad_index(&self) -> u32 {
        let slots = (self.pages * PAGE) as i64;
        self.index.iter().filter(|&&s| s as i64 >= slots).count() as u32
    }
}

/// Compares two outcomes byte for byte, naming the first slot (or row) that differs.
pub fn assert_same(what: &str, got: &CacheOutcome, want: &CacheOutcome) {
    if let Some(at) = got.cache.iter().zip(&want.cache).position(|(a, b)| a != b) {
        let slot = at / MLA_FP8_ROW_BYTES;
        panic!(
            "{what}: cache differs first at slot {slot} byte {} ({:#04x} != {:#04x})",
            at % MLA_FP8_ROW_BYTES,
            got.cache[at],
            want.cache[at]
        );
    }
    if let Some(at) = got
        .workspace
        .iter()
        .zip(&want.workspace)
        .position(|(a, b)| a != b)
    {
        panic!(
            "{what}: workspace differs first at row {} column {} ({:#04x} != {:#04x})",
            at / MLA_CACHE_DIM,
            at % MLA_CACHE_DIM,
            got.workspace[at],
            want.workspace[at]
        );
    }
    assert_eq!(got, want, "{what}: counters or scale differ");
}
