//! The inline syntax of `model!`: one or more `pub mod name { key: value, … }` items.
//!
//! A value is a number, `true`/`false`, a word (`mxfp8`), a string (`"models/inkling.json"`) or
//! a braced map of further entries (`layers: { global: {}, sliding: { … } }`). What the keys
//! mean is decided later (`config.rs`); this module only reads the tokens.

use proc_macro2::Span;
use syn::parse::{Parse, ParseStream};
use syn::{Attribute, Ident, LitBool, LitFloat, LitInt, LitStr, Token, Visibility, braced};

/// Every model item of one invocation.
pub struct Models(pub Vec<ModelItem>);

/// `#[attrs] vis mod name { entries }`.
pub struct ModelItem {
    /// Attributes of the module, doc comments included; they are kept on the output module.
    pub attrs: Vec<Attribute>,
    /// Visibility of the output module.
    pub vis: Visibility,
    /// Name of the output module.
    pub name: Ident,
    /// The `key: value` entries, in the order written.
    pub entries: Vec<Entry>,
}

/// One `key: value`.
pub struct Entry {
    /// The key.
    pub key: Ident,
    /// The value.
    pub value: Value,
}

/// A value as written.
pub enum Value {
    /// A number such as `128`.
    Int(LitInt),
    /// A number with a fraction such as `1.0` (the YaRN `mscale_all_dim`).
    Float(LitFloat),
    /// `true` or `false`.
    Bool(LitBool),
    /// A bare word such as `mxfp8`.
    Word(Ident),
    /// A string such as `"models/inkling.json"`.
    Str(LitStr),
    /// `{ key: value, … }`, with the span of its braces.
    Map(Span, Vec<Entry>),
}

impl Value {
    /// Where the value was written.
    pub fn span(&self) -> Span {
        match self {
            Value::Int(v) => v.span(),
            Value::Float(v) => v.span(),
            Value::Bool(v) => v.span(),
            Value::Word(v) => v.span(),
            Value::Str(v) => v.span(),
            Value::Map(span, _) => *span,
        }
    }
}

impl Parse for Models {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut items = Vec::new();
        while !input.is_empty() {
            items.push(input.parse()?);
        }
        if items.is_empty() {
            return Err(input.error(
                "`model!` expects a module: `pub mod name { num_attention_heads: 64, … }`",
            ));
        }
        Ok(Models(items))
    }
}

impl Parse for ModelItem {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis = input.parse()?;
        input.parse::<Token![mod]>()?;
        let name = input.parse()?;
        let content;
        braced!(content in input);
        Ok(ModelItem {
            attrs,
            vis,
            name,
            entries: parse_entries(&content)?,
        })
    }
}

/// `key: value` pairs separated by commas, with an optional trailing comma.
fn parse_entries(input: ParseStream) -> syn::Result<Vec<Entry>> {
    let mut entries = Vec::new();
    while !input.is_empty() {
        let key: Ident = input.parse()?;
        input.parse::<Token![:]>()?;
        let value = input.parse()?;
        entries.push(Entry { key, value });
        if input.is_empty() {
            break;
        }
        input.parse::<Token![,]>()?;
    }
    Ok(entries)
}

impl Parse for Value {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let lookahead = input.lookahead1();
        if lookahead.peek(LitInt) {
            input.parse().map(Value::Int)
        } else if lookahead.peek(LitFloat) {
            input.parse().map(Value::Float)
        } else if lookahead.peek(LitBool) {
            input.parse().map(Value::Bool)
        } else if lookahead.peek(LitStr) {
            input.parse().map(Value::Str)
        } else if lookahead.peek(Ident) {
            input.parse().map(Value::Word)
        } else if lookahead.peek(syn::token::Brace) {
            let content;
            let brace = braced!(content in input);
            let span = brace.span.join();
            Ok(Value::Map(span, parse_entries(&content)?))
        } else {
            Err(lookahead.error())
        }
    }
}
