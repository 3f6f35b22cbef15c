//! Every value the library claims a rule accepts resolves (with the right derived extents),
//! and the values next to the tables' edges do not.

use shapeproof::dim::Dim;
use shapeproof::rules::*;
use static_assertions::{assert_impl_all, assert_not_impl_any};
use typenum::Unsigned;

fn mxfp8_width<const N: usize>()
where
    Dim<N>: Mxfp8Width,
{
    assert_eq!(<Dim<N> as Mxfp8Width>::HEADS * 128, N);
    assert_eq!(<Dim<N> as Mxfp8Width>::SCALE_BYTES * 32, N);
    assert_eq!(<<Dim<N> as Mxfp8Width>::Heads as Unsigned>::USIZE, N / 128);
}
fn whole_heads<const HD: usize, const N: usize>()
where
    Dim<N>: WholeHeads<HD>,
{
    assert_eq!(<Dim<N> as WholeHeads<HD>>::HEADS * HD, N);
}
fn page_size<const P: usize>()
where
    Dim<P>: PageSize,
{
    assert_eq!(<Dim<P> as PageSize>::SCALE_CHUNKS * 32, P);
}
fn mxfp8_page_size<const P: usize>()
where
    Dim<P>: Mxfp8PageSize + PageSize,
{
}
fn topk_width<const K: usize>()
where
    Dim<K>: TopkWidth,
{
    assert_eq!(<Dim<K> as TopkWidth>::BLOCK_PAIRS * 128, K);
}
fn indexer_topk<const K: usize>()
where
    Dim<K>: IndexerTopk,
{
}

fn indexer_heads<const H: usize>()
where
    Dim<H>: IndexerHeads,
{
}

fn decode_heads<const H: usize>()
where
    Dim<H>: DecodeHeads,
{
}

fn mla_cache_page<const P: usize>()
where
    Dim<P>: MlaCachePage,
{
}

fn mla_scale_group<const G: usize>()
where
    Dim<G>: MlaScaleGroup,
{
}

fn index_cache_page<const P: usize>()
where
    Dim<P>: IndexCachePage,
{
}

fn head_tile<const H: usize>()
where
    Dim<H>: HeadTile + PadsTo<H>,
{
    assert_eq!(<Dim<H> as HeadTile>::TILES * <Dim<H> as HeadTile>::WIDTH, H);
}
fn row_offset<const O: usize>()
where
    Dim<O>: RowOffset,
{
}
fn conv_width<const W: usize>()
where
    Dim<W>: ConvWidth,
{
    assert_eq!(<Dim<W> as ConvWidth>::HISTORY, W - 1);
}

include!(concat!(env!("OUT_DIR"), "/rule_claims.rs"));

#[test]
fn every_claimed_value_resolves() {
    claimed_values_resolve();
}

#[test]
fn table_edges_are_honest() {
    // Just outside each table: the diagnostics' stated ranges end here.
    assert_not_impl_any!(Dim<16512>: Mxfp8Width);
    assert_not_impl_any!(Dim<0>: Mxfp8Width, HeadTile, TopkWidth, PageSize);
    assert_not_impl_any!(Dim<96>: Mxfp8Width);
    assert_not_impl_any!(Dim<8320>: TopkWidth);
    assert_not_impl_any!(Dim<1088>: HeadTile);
    assert_not_impl_any!(Dim<4>: HeadTile);
    assert_not_impl_any!(Dim<24>: HeadTile);
    assert_not_impl_any!(Dim<48>: HeadTile);
    assert_not_impl_any!(Dim<4128>: PageSize);
    assert_not_impl_any!(Dim<32776>: RowOffset);
    assert_not_impl_any!(Dim<1>: ConvWidth);
    assert_not_impl_any!(Dim<9>: ConvWidth);
    assert_not_impl_any!(Dim<64>: Mxfp8PageSize);
    assert_not_impl_any!(Dim<640>: MlaHeadDim);
    assert_not_impl_any!(Dim<96>: PrologueHeadDim);
    assert_impl_all!(Dim<512>: MlaHeadDim);
    assert_impl_all!(Dim<576>: MlaHeadDim);
    // Padding real heads to tiles: 16 -> 64, 65 -> 128, never 64 -> 128.
    assert_impl_all!(Dim<16>: PadsTo<64>);
    assert_impl_all!(Dim<65>: PadsTo<128>);
    assert_not_impl_any!(Dim<64>: PadsTo<128>);
    // Narrow tiles: 12 -> 16, 20 -> 32, 5 -> 8; a count never pads to a tile two sizes up
    // (except the 64-head tile, which takes every count up to 64).
    assert_impl_all!(Dim<12>: PadsTo<16>);
    assert_impl_all!(Dim<20>: PadsTo<32>, PadsTo<64>);
    assert_impl_all!(Dim<5>: PadsTo<8>);
    assert_impl_all!(Dim<40>: PadsTo<64>);
    assert_not_impl_any!(Dim<5>: PadsTo<16>);
    assert_not_impl_any!(Dim<12>: PadsTo<8>, PadsTo<32>);
    assert_not_impl_any!(Dim<40>: PadsTo<32>);
    // Tensor parallelism: heads must divide; KV heads divide or replicate.
    assert_not_impl_any!(Dim<3>: ShardsHeads<64>);
    assert_not_impl_any!(Dim<32>: ShardsHeads<48>);
    assert_impl_all!(Dim<16>: ShardsKvHeads<8>);
    assert_not_impl_any!(Dim<8>: ShardsKvHeads<12>);
    // The lightning indexer: 32 or 64 heads; top-k 128 ..= 2048 in steps of 128.
    assert_not_impl_any!(Dim<16>: IndexerHeads);
    assert_not_impl_any!(Dim<128>: IndexerHeads);
    assert_not_impl_any!(Dim<0>: IndexerTopk);
    assert_not_impl_any!(Dim<2176>: IndexerTopk);
    assert_not_impl_any!(Dim<100>: IndexerTopk);
    // The sparse MLA decode: power-of-two head counts 8 ..= 128, no padding.
    assert_not_impl_any!(Dim<12>: DecodeHeads);
    assert_not_impl_any!(Dim<256>: DecodeHeads);
    // The FP8 sparse MLA cache: pages of 64 tokens, scale groups of 128 channels, nothing else.
    assert_not_impl_any!(Dim<32>: MlaCachePage);
    assert_not_impl_any!(Dim<128>: MlaCachePage);
    assert_not_impl_any!(Dim<64>: MlaScaleGroup);
    assert_not_impl_any!(Dim<256>: MlaScaleGroup);
    // The index-key cache: the MLA cache's pages of 64 tokens.
    assert_not_impl_any!(Dim<32>: IndexCachePage);
    assert_not_impl_any!(Dim<128>: IndexCachePage);
}
