//! One tree for both places a model's numbers come from: the inline entries and a JSON file.
//!
//! Every value remembers its [`Origin`]: the span to report an error at and, for a value read
//! from a file, the file and the key, so that an error about it can name both (a JSON file has no
//! spans of its own; the error points at the path literal).

use std::fmt::Display;
use std::rc::Rc;

use proc_macro2::Span;

use crate::syntax::{Entry as InlineEntry, Value};

/// Where a value was written.
#[derive(Clone)]
pub struct Origin {
    /// The span errors about the value point at.
    pub span: Span,
    /// The JSON file the value was read from, as the user wrote its path.
    pub file: Option<Rc<str>>,
    /// The key path of the value (`head_dim`, `layers.sliding.num_key_value_heads`).
    pub key: String,
}

impl Origin {
    /// A value written inline at `span`.
    pub fn inline(span: Span, key: impl Into<String>) -> Self {
        Origin {
            span,
            file: None,
            key: key.into(),
        }
    }

    /// The origin of the entry `key` inside the map at `self`.
    fn child(&self, span: Span, key: &str) -> Self {
        Origin {
            span,
            file: self.file.clone(),
            key: if self.key.is_empty() {
                key.to_string()
            } else {
                format!("{}.{key}", self.key)
            },
        }
    }

    /// An error about this value: `message` says what is wrong in the user's terms (with the
    /// value they wrote); `note` gives the reason and the fix.
    pub fn error(&self, message: impl Display, note: impl Display) -> syn::Error {
        syn::Error::new(
            self.span,
            format!("{}{message}\n  = note: {note}", self.prefix()),
        )
    }

    /// "`file`, key `k`: " for a value from a file, nothing for an inline one.
    fn prefix(&self) -> String {
        match &self.file {
            Some(file) => format!("`{file}`, key `{}`: ", self.key),
            None => String::new(),
        }
    }
}

/// A value and where it was written.
pub struct Sourced<T> {
    /// The value.
    pub value: T,
    /// Where it was written.
    pub at: Origin,
}

/// A value of the tree.
pub enum Node {
    /// A non-negative whole number.
    Int(u64),
    /// Any other number (a JSON float, an inline `1.0`).
    Float(f64),
    /// `true` / `false`.
    Bool(bool),
    /// A word or a string.
    Word(String),
    /// Nested entries.
    Map(Map),
    /// Something the model keys never take (a JSON array, a float, `null`); named for errors.
    Other(&'static str),
}

impl Node {
    /// What the value is, for "expects a number, found …" errors.
    fn describe(&self) -> String {
        match self {
            Node::Int(v) => format!("the number {v}"),
            Node::Float(v) => format!("the number {v}"),
            Node::Bool(v) => format!("`{v}`"),
            Node::Word(w) => format!("`{w}`"),
            Node::Map(_) => "a map".to_string(),
            Node::Other(what) => what.to_string(),
        }
    }
}

/// One `key: value` of a map.
pub struct Entry {
    /// The key.
    pub key: String,
    /// Where the key was written (for a JSON value: the path literal).
    pub key_span: Span,
    /// The value.
    pub node: Sourced<Node>,
}

/// A map of entries: the body of a model item, or a nested map such as `layers`.
pub struct Map {
    /// The entries, in the order written (a later duplicate overrides an earlier one).
    pub entries: Vec<Entry>,
    /// Where the map itself was written.
    pub at: Origin,
    /// Whether a key nobody reads is an error. Inline entries always are (a typo must not pass
    /// silently); the top level of a JSON file is not, because a Hugging Face `config.json`
    /// holds many keys the kernels do not need.
    pub strict: bool,
}

impl Map {
    /// The inline entries `entries`, written at `at`.
    pub fn from_inline(entries: &[InlineEntry], at: Origin) -> syn::Result<Map> {
        let mut out = Vec::new();
        for entry in entries {
            let key = entry.key.to_string();
            let origin = at.child(entry.value.span(), &key);
            let node = match &entry.value {
                Value::Int(lit) => Node::Int(lit.base10_parse::<u64>().map_err(|_| {
                    origin.error(
                        format!("`{lit}` is not a whole number"),
                        "shapes are counted in whole, non-negative numbers",
                    )
                })?),
                Value::Float(lit) => Node::Float(lit.base10_parse::<f64>()?),
                Value::Bool(lit) => Node::Bool(lit.value),
                Value::Word(word) => Node::Word(word.to_string()),
                Value::Str(lit) => Node::Word(lit.value()),
                Value::Map(_, inner) => Node::Map(Map::from_inline(inner, origin.clone())?),
            };
            out.push(Entry {
                key,
                key_span: entry.key.span(),
                node: Sourced {
                    value: node,
                    at: origin,
                },
            });
        }
        Ok(Map {
            entries: out,
            at,
            strict: true,
        })
    }

    /// The JSON object `object` of file `file`, reported at `at` (the path literal).
    pub fn from_json(object: &serde_json::Map<String, serde_json::Value>, at: Origin) -> Map {
        let entries = object
            .iter()
            .map(|(key, value)| {
                let origin = at.child(at.span, key);
                let node = match value {
                    serde_json::Value::Number(n) => match (n.as_u64(), n.as_f64()) {
                        (Some(v), _) => Node::Int(v),
                        (None, Some(v)) => Node::Float(v),
                        (None, None) => Node::Other("a number out of range"),
                    },
                    serde_json::Value::Bool(b) => Node::Bool(*b),
                    serde_json::Value::String(s) => Node::Word(s.clone()),
                    serde_json::Value::Object(inner) => {
                        let mut map = Map::from_json(inner, origin.clone());
                        map.strict = true;
                        Node::Map(map)
                    }
                    serde_json::Value::Array(_) => Node::Other("an array"),
                    serde_json::Value::Null => Node::Other("`null`"),
                };
                Entry {
                    key: key.clone(),
                    key_span: at.span,
                    node: Sourced {
                        value: node,
                        at: origin,
                    },
                }
            })
            .collect();
        Map {
            entries,
            at,
            strict: false,
        }
    }

    /// `self` with the entries of `over` added, replacing entries of the same key.
    pub fn overridden_by(mut self, over: Map) -> Map {
        for entry in over.entries {
            self.entries.retain(|e| e.key != entry.key);
            self.entries.push(entry);
        }
        self.at = over.at;
        self
    }

    /// Removes and returns the value of `key`.
    pub fn take(&mut self, key: &str) -> Option<Sourced<Node>> {
        let i = self.entries.iter().rposition(|e| e.key == key)?;
        Some(self.entries.remove(i).node)
    }

    /// The number at `key`, if present.
    pub fn int(&mut self, key: &str) -> syn::Result<Option<Sourced<u64>>> {
        self.typed(key, "a number such as `128`", |node| match node {
            Node::Int(v) => Ok(v),
            other => Err(other),
        })
    }

    /// The number at `key` (whole or not), if present.
    pub fn number(&mut self, key: &str) -> syn::Result<Option<Sourced<f64>>> {
        self.typed(key, "a number such as `40` or `1.0`", |node| match node {
            Node::Int(v) => Ok(v as f64),
            Node::Float(v) => Ok(v),
            other => Err(other),
        })
    }

    /// The boolean at `key`, if present.
    pub fn boolean(&mut self, key: &str) -> syn::Result<Option<Sourced<bool>>> {
        self.typed(key, "`true` or `false`", |node| match node {
            Node::Bool(v) => Ok(v),
            other => Err(other),
        })
    }

    /// The word at `key`, if present.
    pub fn word(&mut self, key: &str) -> syn::Result<Option<Sourced<String>>> {
        self.typed(key, "a word such as `mxfp8`", |node| match node {
            Node::Word(v) => Ok(v),
            other => Err(other),
        })
    }

    /// The nested map at `key`, if present.
    pub fn map(&mut self, key: &str) -> syn::Result<Option<Map>> {
        Ok(self
            .typed(key, "a map `{ … }`", |node| match node {
                Node::Map(v) => Ok(v),
                other => Err(other),
            })?
            .map(|m| m.value))
    }

    fn typed<T>(
        &mut self,
        key: &str,
        expected: &str,
        pick: impl FnOnce(Node) -> Result<T, Node>,
    ) -> syn::Result<Option<Sourced<T>>> {
        let Some(Sourced { value, at }) = self.take(key) else {
            return Ok(None);
        };
        match pick(value) {
            Ok(value) => Ok(Some(Sourced { value, at })),
            Err(other) => Err(at.error(
                format!("`{key}` expects {expected}, found {}", other.describe()),
                format!("write `{key}: <value>` as documented for `shapeproof::model!`"),
            )),
        }
    }

    /// Checks that every entry was read: an entry left over is a key the macro does not know.
    /// `known` lists the keys of this map, for the note.
    pub fn finish(self, known: &[&str]) -> syn::Result<()> {
        for entry in self.entries {
            if self.strict || entry.node.at.file.is_none() {
                let at = Origin {
                    span: entry.key_span,
                    ..entry.node.at
                };
                let hint = match closest(&entry.key, known) {
                    Some(near) => format!(": did you mean `{near}`?"),
                    None => String::new(),
                };
                return Err(at.error(
                    format!("unknown key `{}`{hint}", entry.key),
                    format!("the keys here are: {}", known.join(", ")),
                ));
            }
        }
        Ok(())
    }
}

/// The known key `key` most likely stands for: the shortest known key it abbreviates (its
/// letters in order, as `num_kv_heads` in `num_key_value_heads`), else the nearest in edit
/// distance if it is near enough to be a typo.
fn closest<'k>(key: &str, known: &[&'k str]) -> Option<&'k str> {
    let abbreviated = known
        .iter()
        .filter(|k| is_subsequence(key, k))
        .min_by_key(|k| k.len());
    abbreviated.copied().or_else(|| {
        known
            .iter()
            .map(|k| (edit_distance(key, k), *k))
            .filter(|(d, k)| *d <= k.len() / 2)
            .min()
            .map(|(_, k)| k)
    })
}

/// Whether the bytes of `short` occur in `long` in order.
fn is_subsequence(short: &str, long: &str) -> bool {
    let mut rest = long.bytes();
    short.bytes().all(|c| rest.any(|l| l == c))
}

/// Levenshtein distance over bytes (keys are ASCII).
fn edit_distance(a: &str, b: &str) -> usize {
    let b = b.as_bytes();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.bytes().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != cb));
            diagonal = above;
        }
    }
    row[b.len()]
}
