//! One declaration for every checked argument struct of the ops.
//!
//! A checked struct ties tensors whose extents must agree (a batch, an output set, a cache).
//! Its fields are private so that the tie made by its constructor holds; everything around the
//! tie is the same for every struct, so [`checked_struct!`] writes it from one declaration:
//!
//! - the struct, with private fields and the storage parameter `S` (default `Owned`);
//! - its `…Parts` struct, the same fields public, given back by `into_parts`;
//! - a reader for every field (`&Tensor`, `Option<&Tensor>`, or the value);
//! - a [`FixedExtent`](crate::tensor::FixedExtent) writer for every tensor field declared with
//!   `/ name_mut` (contents can change, the extent cannot);
//! - optionally a `…Slices` struct of borrowed slices (`read`: `B::Slice`, `write`:
//!   `B::SliceMut`) and the `slices()` / `slices_mut()` method that fills it, which is how the
//!   op's call borrows the struct.
//!
//! Only the tie, the constructor that checks the extents, is written by hand beside it.
//!
//! A field is declared as `name: kind(…)`:
//!
//! | kind                      | field                | reader                | slice                    |
//! |---------------------------|----------------------|-----------------------|--------------------------|
//! | `tensor(T, R) / name_mut` | `Tensor<B, T, R, S>` | `&Tensor`             | `B::Slice<T>` / `SliceMut` |
//! | `option(T, R)`            | `Option<Tensor<…>>`  | `Option<&Tensor>`     | `Option<B::Slice<T>>`    |
//! | `value(ty)`               | `ty` (`Copy`)        | the value             | the value                |
//! | `checked(Ty => TySlices)` | `Option<Ty>`         | `Option<&Ty>`         | `Option<TySlices>`       |
//! | `raw(ty)`                 | `ty`                 | none (written by hand) | `()`                    |
//!
//! Generic parameters are written without `B` and `S`, which every struct has (first and
//! last): the const parameters (all `usize`) in one bracket, the type parameters (with the
//! bounds the struct itself needs) in a second, so `ConvState [const DKV] [C]` is
//! `ConvState<B, const DKV: usize, C, S: Storage<B> = Owned>`. Bounds that only the methods
//! need go in `impl where [...]`.

/// Generates a checked struct, its `…Parts`, its readers and writers, `into_parts` and
/// (optionally) its borrowed slices; see the module documentation.
macro_rules! checked_struct {
    (
        $(#[$doc:meta])*
        pub struct $name:ident [$(const $c:ident),*] [$($t:ident $(: $tb:path)?),*]
        impl where [$($wb:tt)*]
        {
            $(
                $(#[$fdoc:meta])*
                $field:ident: $kind:ident($($spec:tt)*) $(/ $field_mut:ident)?,
            )*
        }
        $(#[$pdoc:meta])*
        parts $parts:ident;
        $(
            $(#[$sdoc:meta])*
            slices $slices:ident: $mode:ident;
        )?
    ) => {
        $(#[$doc])*
        pub struct $name<
            B: $crate::backend::Backend,
            $(const $c: usize,)*
            $($t $(: $tb)?,)*
            S: $crate::tensor::Storage<B> = $crate::tensor::Owned,
        > {
            $(
                $(#[$fdoc])*
                $field: $crate::ops::checked::checked_struct!(@type $kind($($spec)*)),
            )*
        }

        $(#[$pdoc])*
        pub struct $parts<
            B: $crate::backend::Backend,
            $(const $c: usize,)*
            $($t $(: $tb)?,)*
            S: $crate::tensor::Storage<B> = $crate::tensor::Owned,
        > {
            $(
                $(#[$fdoc])*
                pub $field: $crate::ops::checked::checked_struct!(@type $kind($($spec)*)),
            )*
        }

        impl<
            B: $crate::backend::Backend,
            $(const $c: usize,)*
            $($t $(: $tb)?,)*
            S: $crate::tensor::Storage<B>,
        > $name<B, $($c,)* $($t,)* S>
        where
            $($wb)*
        {
            $(
                $crate::ops::checked::checked_struct!(
                    @read [$(#[$fdoc])*] $field $kind($($spec)*)
                );
                $crate::ops::checked::checked_struct!(
                    @write [$($field_mut)?] $field $kind($($spec)*)
                );
            )*

            #[doc = concat!("The fields back, as a [`", stringify!($parts), "`].")]
            pub fn into_parts(self) -> $parts<B, $($c,)* $($t,)* S> {
                $parts {
                    $($field: self.$field,)*
                }
            }
        }

        $crate::ops::checked::checked_struct!(
            @slices [$($mode [$(#[$sdoc])*] $slices)?] $name
            [$($c)*] [$($t $(: $tb)?),*] [$($wb)*]
            $(($field $kind($($spec)*)))*
        );
    };

    // The field's type.
    (@type tensor($t:ty, $r:ty)) => { $crate::tensor::Tensor<B, $t, $r, S> };
    (@type option($t:ty, $r:ty)) => { Option<$crate::tensor::Tensor<B, $t, $r, S>> };
    (@type value($t:ty)) => { $t };
    (@type checked($t:ty => $s:ident)) => { Option<$t> };
    (@type raw($t:ty)) => { $t };

    // The reader.
    (@read [$(#[$fdoc:meta])*] $field:ident tensor($t:ty, $r:ty)) => {
        $(#[$fdoc])*
        pub fn $field(&self) -> &$crate::tensor::Tensor<B, $t, $r, S> {
            &self.$field
        }
    };
    (@read [$(#[$fdoc:meta])*] $field:ident option($t:ty, $r:ty)) => {
        $(#[$fdoc])*
        pub fn $field(&self) -> Option<&$crate::tensor::Tensor<B, $t, $r, S>> {
            self.$field.as_ref()
        }
    };
    (@read [$(#[$fdoc:meta])*] $field:ident value($t:ty)) => {
        $(#[$fdoc])*
        pub fn $field(&self) -> $t {
            self.$field
        }
    };
    (@read [$(#[$fdoc:meta])*] $field:ident checked($t:ty => $s:ident)) => {
        $(#[$fdoc])*
        pub fn $field(&self) -> Option<&$t> {
            self.$field.as_ref()
        }
    };
    (@read [$(#[$fdoc:meta])*] $field:ident raw($t:ty)) => {};

    // The in-place writer of a tensor field.
    (@write [] $field:ident $kind:ident($($spec:tt)*)) => {};
    (@write [$field_mut:ident] $field:ident tensor($t:ty, $r:ty)) => {
        #[doc = concat!(
            "`", stringify!($field), "`, writable in place (contents only; the extent stays)."
        )]
        pub fn $field_mut(&mut self) -> $crate::tensor::FixedExtent<'_, B, $t, $r, S> {
            $crate::tensor::FixedExtent::new(&mut self.$field)
        }
    };

    // No borrowed slices.
    (@slices [] $($rest:tt)*) => {};

    // The borrowed slices: read-only.
    (
        @slices [read [$(#[$sdoc:meta])*] $slices:ident] $name:ident
        [$($c:ident)*] [$($t:ident $(: $tb:path)?),*] [$($wb:tt)*]
        $(($field:ident $kind:ident($($spec:tt)*)))*
    ) => {
        $(#[$sdoc])*
        pub struct $slices<'a, B: $crate::backend::Backend> {
            $(
                pub(crate) $field: $crate::ops::checked::checked_struct!(
                    @slice_type read $kind($($spec)*)
                ),
            )*
        }

        impl<
            B: $crate::backend::Backend,
            $(const $c: usize,)*
            $($t $(: $tb)?,)*
            S: $crate::tensor::Storage<B>,
        > $name<B, $($c,)* $($t,)* S>
        where
            $($wb)*
        {
            /// The fields as borrowed slices, for the op's call.
            pub(crate) fn slices(&self) -> $slices<'_, B> {
                $slices {
                    $($field: $crate::ops::checked::checked_struct!(
                        @slice read $kind($($spec)*) (self.$field)
                    ),)*
                }
            }
        }
    };

    // The borrowed slices: writable.
    (
        @slices [write [$(#[$sdoc:meta])*] $slices:ident] $name:ident
        [$($c:ident)*] [$($t:ident $(: $tb:path)?),*] [$($wb:tt)*]
        $(($field:ident $kind:ident($($spec:tt)*)))*
    ) => {
        $(#[$sdoc])*
        pub struct $slices<'a, B: $crate::backend::Backend> {
            $(
                pub(crate) $field: $crate::ops::checked::checked_struct!(
                    @slice_type write $kind($($spec)*)
                ),
            )*
        }

        impl<
            B: $crate::backend::Backend,
            $(const $c: usize,)*
            $($t $(: $tb)?,)*
            S: $crate::tensor::StorageMut<B>,
        > $name<B, $($c,)* $($t,)* S>
        where
            $($wb)*
        {
            /// The fields as borrowed writable slices, for the op's call.
            pub(crate) fn slices_mut(&mut self) -> $slices<'_, B> {
                $slices {
                    $($field: $crate::ops::checked::checked_struct!(
                        @slice write $kind($($spec)*) (self.$field)
                    ),)*
                }
            }
        }
    };

    (@slice_type read tensor($t:ty, $r:ty)) => { B::Slice<'a, $t> };
    (@slice_type write tensor($t:ty, $r:ty)) => { B::SliceMut<'a, $t> };
    (@slice_type read option($t:ty, $r:ty)) => { Option<B::Slice<'a, $t>> };
    (@slice_type $mode:ident value($t:ty)) => { $t };
    (@slice_type read checked($t:ty => $s:ident)) => { Option<$s<'a, B>> };
    (@slice_type $mode:ident raw($t:ty)) => { () };

    (@slice read tensor($t:ty, $r:ty) ($e:expr)) => { $e.as_slice() };
    (@slice write tensor($t:ty, $r:ty) ($e:expr)) => { $e.as_slice_mut() };
    (@slice read option($t:ty, $r:ty) ($e:expr)) => { $e.as_ref().map(|t| t.as_slice()) };
    (@slice $mode:ident value($t:ty) ($e:expr)) => { $e };
    (@slice read checked($t:ty => $s:ident) ($e:expr)) => { $e.as_ref().map(|t| t.slices()) };
    (@slice $mode:ident raw($t:ty) ($e:expr)) => { () };
}

pub(crate) use checked_struct;
