//! `dim_rule!`: a shape rule of a user's kernel as a marker trait on `Dim<N>`, with its
//! diagnostic and its table of values, from one declaration.
//!
//! ```text
//! dim_rule! {
//!     /// doc
//!     pub trait Name for 32..=1024 step 32 {      // or: for [8, 16, 32]
//!         message: "…", label: "…", note: "…",
//!     }
//! }
//! ```
//!
//! A range's impls are marked `#[diagnostic::do_not_recommend]` (the error states the rule
//! instead of listing every value); a list's are not (the error lists them).

use proc_macro2::TokenStream;
use quote::quote;
use syn::parse::{Parse, ParseStream};
use syn::{Attribute, Ident, LitInt, LitStr, Token, Visibility, braced, bracketed};

/// Most values one rule's table holds.
const MAX_VALUES: u64 = 4096;

/// Which values satisfy the rule.
enum Values {
    /// `first..=last step step`.
    Range { first: u64, last: u64, step: u64 },
    /// `[a, b, …]`.
    List(Vec<u64>),
}

/// One parsed declaration.
pub struct DimRule {
    attrs: Vec<Attribute>,
    vis: Visibility,
    name: Ident,
    values: Values,
    message: LitStr,
    label: LitStr,
    note: LitStr,
}

fn int(input: ParseStream) -> syn::Result<u64> {
    input.parse::<LitInt>()?.base10_parse()
}

impl Parse for DimRule {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis: Visibility = input.parse()?;
        input.parse::<Token![trait]>()?;
        let name: Ident = input.parse()?;
        input.parse::<Token![for]>()?;
        let values = if input.peek(syn::token::Bracket) {
            let list;
            bracketed!(list in input);
            let items = list.parse_terminated(|p| int(p), Token![,])?;
            Values::List(items.into_iter().collect())
        } else {
            let first = int(input)?;
            input.parse::<Token![..=]>()?;
            let last = int(input)?;
            let step_kw: Ident = input.parse()?;
            if step_kw != "step" {
                return Err(syn::Error::new(step_kw.span(), "expected `step`"));
            }
            let step_span = input.span();
            let step = int(input)?;
            if step == 0 || first > last {
                return Err(syn::Error::new(
                    step_span,
                    "a range needs first <= last and a positive step",
                ));
            }
            // One impl a value: a table past this size is a mistake, not a rule.
            if (last - first) / step >= MAX_VALUES {
                return Err(syn::Error::new(
                    step_span,
                    format!("a rule lists at most {MAX_VALUES} values; this range has more"),
                ));
            }
            Values::Range { first, last, step }
        };
        let body;
        braced!(body in input);
        let (mut message, mut label, mut note) = (None, None, None);
        while !body.is_empty() {
            let key: Ident = body.parse()?;
            body.parse::<Token![:]>()?;
            let text: LitStr = body.parse()?;
            match key.to_string().as_str() {
                "message" => message = Some(text),
                "label" => label = Some(text),
                "note" => note = Some(text),
                _ => {
                    return Err(syn::Error::new(
                        key.span(),
                        "expected `message`, `label` or `note`",
                    ));
                }
            }
            if !body.is_empty() {
                body.parse::<Token![,]>()?;
            }
        }
        let missing = |what: &str| {
            syn::Error::new(
                name.span(),
                format!("the rule needs a `{what}: \"…\"` line"),
            )
        };
        Ok(Self {
            message: message.ok_or_else(|| missing("message"))?,
            label: label.ok_or_else(|| missing("label"))?,
            note: note.ok_or_else(|| missing("note"))?,
            attrs,
            vis,
            name,
            values,
        })
    }
}

impl DimRule {
    /// The trait and its impls.
    pub fn expand(&self) -> TokenStream {
        let Self {
            attrs,
            vis,
            name,
            message,
            label,
            note,
            ..
        } = self;
        let (values, hide) = match &self.values {
            Values::Range { first, last, step } => (
                (*first..=*last).step_by(*step as usize).collect::<Vec<_>>(),
                quote!(#[diagnostic::do_not_recommend]),
            ),
            Values::List(list) => (list.clone(), quote!()),
        };
        let values = values
            .into_iter()
            .map(|v| proc_macro2::Literal::usize_unsuffixed(v as usize));
        quote! {
            #(#attrs)*
            #[diagnostic::on_unimplemented(message = #message, label = #label, note = #note)]
            #vis trait #name {}
            #(
                #hide
                impl #name for ::shapeproof::dim::Dim<#values> {}
            )*
        }
    }
}
