//! Extents: static ones as types, dynamic ones as named values.
//!
//! A static extent is `Dim<N>`; the rules of `crate::rules` are traits implemented for exactly the
//! `Dim<N>` that satisfy them, and derived extents (heads in a width, scale bytes, the history
//! length of a conv) are their associated consts, or typenum types where a length must be a type.
//! A dynamic extent is a plain count wrapped in a type that names it (`Tokens`, `Seqs`, …), so
//! an error at the boundary can say which extent disagreed.

/// A static extent `N`, the carrier of every shape rule (`Dim<96>: Mxfp8Width` does not hold).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Dim<const N: usize>;

impl<const N: usize> Dim<N> {
    /// The extent as a value.
    pub const VALUE: usize = N;
}

/// A runtime extent with a name, decided by the batch rather than the model.
pub trait Extent: Copy + Into<usize> {
    /// What the extent counts, for error messages (`"tokens"`).
    const NAME: &'static str;
}

macro_rules! named_extent {
    ($(#[$doc:meta] $ty:ident = $name:literal;)*) => {$(
        #[$doc]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $ty(pub usize);
        impl Extent for $ty {
            const NAME: &'static str = $name;
        }
        impl From<$ty> for usize {
            fn from(e: $ty) -> usize {
                e.0
            }
        }
    )*};
}

named_extent! {
    /// Number of tokens in a batch (`T`).
    Tokens = "tokens";
    /// Number of sequences in a batch (`B`).
    Seqs = "sequences";
    /// Number of KV pages in a paged pool.
    Pages = "pages";
    /// Number of rows of a buffer whose rows are addressed by an index (conv-state slots, KV rows).
    Rows = "rows";
}

/// A dynamic extent known to be a multiple of the static `PAGE`: `pages × PAGE` KV slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PagedSlots<const PAGE: usize> {
    pages: Pages,
}

impl<const PAGE: usize> PagedSlots<PAGE> {
    /// `pages × PAGE` slots.
    pub const fn new(pages: usize) -> Self {
        Self {
            pages: Pages(pages),
        }
    }
    /// Number of pages.
    pub const fn pages(self) -> usize {
        self.pages.0
    }
    /// Number of slots, `pages × PAGE`.
    pub const fn slots(self) -> usize {
        self.pages.0 * PAGE
    }
}
