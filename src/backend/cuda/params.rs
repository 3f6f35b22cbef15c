//! Parameter blocks: the `#[repr(C)]` Rust mirror of a kernel's one by-value parameter struct,
//! with its layout known field by field so it can be checked against the CUDA struct.
//!
//! A mirror that drifts from its CUDA struct (a field added on one side, an `i32` that became
//! an `i64`) makes the kernel read its pointers from the wrong bytes: an out-of-bounds access
//! no type would catch. [`param_block!`](crate::param_block) declares a mirror and its layout
//! from one field list; [`check_params`] compiles the kernel's source with a `static_assert` of
//! the struct's size and of every field's offset and size, so the test suite fails (with the
//! field named) instead of a kernel.

use super::jit::{Arch, compile_kernel};
use super::launch::CudaKernel;
use crate::error::Result;

/// A kernel's parameter block: `#[repr(C)]`, plain data, and its layout as a table. Declare it
/// with [`param_block!`](crate::param_block), which writes the table from the fields.
pub trait ParamBlock: Copy + 'static {
    /// The name of the CUDA struct it mirrors.
    const CUDA_NAME: &'static str;
    /// Every field, in order: its name in both languages, byte offset and size.
    const FIELDS: &'static [ParamField];
}

/// One field of a [`ParamBlock`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamField {
    /// The field's name (the same in Rust and CUDA).
    pub name: &'static str,
    /// Byte offset in the block.
    pub offset: usize,
    /// Size in bytes.
    pub size: usize,
}

/// Declares a kernel's parameter block: a `#[repr(C)]` struct (`Clone`, `Copy`, `Debug`,
/// `Default`) whose fields are, in order and by name, those of the CUDA struct of the same
/// name, and its [`ParamBlock`] table. A field may carry a visibility (`pub q: u64`) when code
/// outside the module fills the block for a raw launch of the same kernel.
///
/// ```
/// shapeproof::param_block! {
///     /// `struct ScaleParams` of the kernel source.
///     pub struct ScaleParams {
///         x: u64,
///         rows: i64,
///         factor: f32,
///     }
/// }
/// use shapeproof::backend::cuda::ParamBlock;
/// assert_eq!(ScaleParams::FIELDS[2].offset, 16);
/// ```
#[macro_export]
macro_rules! param_block {
    ($(#[$meta:meta])* $vis:vis struct $name:ident { $($fvis:vis $field:ident: $ty:ty),* $(,)? }) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default)]
        $vis struct $name {
            $($fvis $field: $ty,)*
        }
        impl $crate::backend::cuda::ParamBlock for $name {
            const CUDA_NAME: &'static str = stringify!($name);
            const FIELDS: &'static [$crate::backend::cuda::ParamField] = &[$(
                $crate::backend::cuda::ParamField {
                    name: stringify!($field),
                    offset: ::core::mem::offset_of!($name, $field),
                    size: ::core::mem::size_of::<$ty>(),
                },
            )*];
        }
    };
}

/// Declares a kernel of your own in one place: its parameter block ([`param_block!`]) and the
/// [`CudaKernel`](super::CudaKernel) impl of the Rust type that selects its instantiation
/// (the type's const parameters fill the template arguments of `instantiation`).
///
/// ```
/// pub struct Scale<const N: usize>;
/// shapeproof::cuda_kernel! {
///     impl CudaKernel for Scale<const N: usize> {
///         source: "struct ScaleParams { unsigned long long x; long long rows; float factor; };",
///         instantiation: "scale_kernel<{N}>",
///         params: pub struct ScaleParams { x: u64, rows: i64, factor: f32 },
///     }
/// }
/// use shapeproof::backend::cuda::CudaKernel;
/// assert_eq!(Scale::<4>::instantiation(), "scale_kernel<4>");
/// ```
#[macro_export]
macro_rules! cuda_kernel {
    (
        impl CudaKernel for $ty:ident $(< $(const $c:ident : usize),* >)? {
            source: $source:expr,
            instantiation: $inst:literal,
            $(dynamic_smem_bytes: $smem:expr,)?
            params: $(#[$pmeta:meta])* $pvis:vis struct $params:ident {
                $($field:ident: $fty:ty),* $(,)?
            } $(,)?
        }
    ) => {
        $crate::param_block! {
            $(#[$pmeta])*
            /// The kernel's parameter block, field for field its CUDA struct.
            $pvis struct $params { $($field: $fty),* }
        }
        impl $(< $(const $c: usize),* >)? $crate::backend::cuda::CudaKernel
            for $ty $(< $($c),* >)?
        {
            const SOURCE: &'static str = $source;
            $(const DYNAMIC_SMEM_BYTES: u32 = $smem;)?
            type Params = $params;
            fn instantiation() -> ::std::string::String {
                format!($inst)
            }
        }
    };
}

/// The `static_assert`s that hold when the CUDA struct of `P` has the Rust mirror's layout:
/// its size, and every field's offset and size.
///
/// NVRTC ships no `<cstddef>`, so there is no `offsetof`; the offsets are taken with
/// `__INTADDR__`, the constant-address primitive its front end's own `offsetof` is built on.
pub fn layout_asserts<P: ParamBlock>() -> String {
    let name = P::CUDA_NAME;
    let mut text = format!(
        "\n// The Rust mirror's layout of `{name}`.\nstatic_assert(sizeof({name}) == {size}, \"{name}: the Rust mirror is {size} bytes\");\n",
        size = std::mem::size_of::<P>()
    );
    for f in P::FIELDS {
        text += &format!(
            "static_assert((unsigned long long)__INTADDR__(&((({name} *)0)->{field})) == {offset}, \"{name}.{field}: the Rust mirror has it at byte {offset}\");\n\
             static_assert(sizeof({name}::{field}) == {size}, \"{name}.{field}: the Rust mirror's field is {size} bytes\");\n",
            field = f.name,
            offset = f.offset,
            size = f.size
        );
    }
    text
}

/// Compiles kernel `K` with [`layout_asserts`] of its parameter block appended: `Ok` when the
/// CUDA struct and the Rust mirror agree, else the compile error naming the field. A test of
/// every kernel's mirror (the library's run in its NVRTC tests); needs NVRTC, not a GPU.
pub fn check_params<K: CudaKernel>(arch: Arch) -> Result<()> {
    let source = format!("{}{}", K::SOURCE, layout_asserts::<K::Params>());
    compile_kernel(&source, &K::instantiation(), arch).map(|_| ())
}
