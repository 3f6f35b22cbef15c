//! Reading a model's `config.json` at compile time.
//!
//! The path is relative to the crate's `CARGO_MANIFEST_DIR`; when no file is there, it is looked
//! up next to the source file that invokes the macro (the convention of `include_str!`). The
//! macro output names the file in an `include_bytes!`, so editing it rebuilds the crate.

use std::path::PathBuf;
use std::rc::Rc;

use syn::LitStr;

use crate::source::{Map, Origin};

/// A parsed JSON file: its top-level object as a tree, and where it was found.
pub struct Loaded {
    /// The top-level object.
    pub map: Map,
    /// The file's full path, for `include_bytes!`.
    pub path: PathBuf,
}

/// Reads and parses the file named by `lit`.
pub fn load(lit: &LitStr) -> syn::Result<Loaded> {
    let written = lit.value();
    let origin = Origin::inline(lit.span(), "config");
    let fail = |what: String, note: &str| origin.error(what, note);

    let candidates = candidates(&written);
    let Some(path) = candidates.iter().find(|p| p.is_file()).cloned() else {
        return Err(fail(
            format!("model config file `{written}` not found"),
            "the path is relative to the crate root (CARGO_MANIFEST_DIR), or to the file that invokes `model!`",
        ));
    };
    let bytes = std::fs::read(&path).map_err(|e| {
        fail(
            format!("cannot read `{written}`: {e}"),
            "check the file's permissions",
        )
    })?;
    let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
        fail(
            format!("`{written}` is not valid JSON: {e}"),
            "a model config is a JSON object such as a Hugging Face `config.json`",
        )
    })?;
    let serde_json::Value::Object(object) = value else {
        return Err(fail(
            format!("`{written}` does not hold a JSON object"),
            "a model config is a JSON object such as a Hugging Face `config.json`",
        ));
    };
    let at = Origin {
        span: lit.span(),
        file: Some(Rc::from(written.as_str())),
        key: String::new(),
    };
    Ok(Loaded {
        map: Map::from_json(&object, at),
        path,
    })
}

/// Where to look for `written`, in order.
fn candidates(written: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let relative = PathBuf::from(written);
    if relative.is_absolute() {
        out.push(relative);
        return out;
    }
    if let Some(root) = std::env::var_os("CARGO_MANIFEST_DIR") {
        out.push(PathBuf::from(root).join(&relative));
    }
    if let Some(dir) = proc_macro::Span::call_site()
        .local_file()
        .and_then(|file| file.parent().map(PathBuf::from))
    {
        out.push(dir.join(&relative));
    }
    out
}
