//! The shape rules of the kernels, one named trait each.
//!
//! A rule holds for a value when its trait is implemented for `Dim<value>`; the implementations
//! are generated tables over the values the domain needs, so a value that breaks a rule — or lies
//! outside the table — has no implementation and the compiler reports the trait's diagnostic: the
//! message names the value, the label states the rule, the note gives the reason and the fix.
//! Every rule has a compile-fail case in `tests/ui/fail/`.
//!
//! Each rule — its values and its wording — is stated once, in the rule catalogue (the
//! `shapeproof-rules` crate). The build script generates from it the traits below (with their
//! diagnostics), their tables and the `MAX_*` constants; the `model!` macro takes its checks and
//! its error texts from the same catalogue.
//!
//! Rules are bounds on constructors (one clean `E0277` at the call), never on structs.

use crate::dim::Dim;

include!(concat!(env!("OUT_DIR"), "/rule_tables.rs"));
