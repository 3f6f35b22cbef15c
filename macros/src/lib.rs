//! Compile-time-checked model definitions for `shapeproof`: the `model!` macro, and
//! `dim_rule!`, a user kernel's shape rule as a marker trait.
//!
//! Use it through the main crate, as `shapeproof::model!`; its documentation there describes
//! the syntax. This crate reads the configuration (`syntax.rs` inline, `json.rs` from a file,
//! merged in `source.rs`), types it (`config.rs`), checks it against the kernels' rules (taken
//! from the rule catalogue, `shapeproof-rules`) and computes the per-rank geometry
//! (`geometry.rs`), and writes the module (`emit.rs`).

extern crate proc_macro;

mod config;
mod dim_rule;
mod emit;
mod geometry;
mod json;
mod source;
mod syntax;

use proc_macro::TokenStream;
use syn::parse_macro_input;

use crate::source::{Map, Origin};
use crate::syntax::{ModelItem, Models, Value};

/// Defines one module per model with its per-rank geometry, kernel types and KV cache types;
/// a configuration that breaks a kernel rule does not compile. See `shapeproof::model!`.
#[proc_macro]
pub fn model(input: TokenStream) -> TokenStream {
    let Models(items) = parse_macro_input!(input as Models);
    let mut out = proc_macro2::TokenStream::new();
    for item in &items {
        match expand(item) {
            Ok(tokens) => out.extend(tokens),
            Err(error) => out.extend(error.to_compile_error()),
        }
    }
    out.into()
}

/// A shape rule of a user's kernel: a marker trait on `Dim<N>` with its diagnostic, implemented
/// for the values of a range or a list. See `shapeproof::dim_rule!`.
#[proc_macro]
pub fn dim_rule(input: TokenStream) -> TokenStream {
    parse_macro_input!(input as dim_rule::DimRule)
        .expand()
        .into()
}

/// One model item: read, check, emit.
fn expand(item: &ModelItem) -> syn::Result<proc_macro2::TokenStream> {
    let at = Origin::inline(item.name.span(), "");
    let inline = Map::from_inline(&item.entries, at)?;

    // `config: "file.json"` puts the file's keys under the inline ones.
    let file = item.entries.iter().find(|e| e.key == "config");
    let (map, json_path) = match file.map(|e| &e.value) {
        None => (inline, None),
        Some(Value::Str(path)) => {
            let loaded = json::load(path)?;
            let mut inline = inline;
            inline.take("config");
            (loaded.map.overridden_by(inline), Some(loaded.path))
        }
        Some(other) => {
            return Err(syn::Error::new(
                other.span(),
                "`config` expects the path of a JSON file, such as `config: \"models/inkling.json\"`",
            ));
        }
    };

    let model = config::Model::read(map, item.name.span())?;
    let plan = geometry::plan(&model)?;
    Ok(emit::model(
        item,
        &plan,
        model.tensor_parallel.value,
        json_path.as_deref(),
    ))
}
