// The traits the kernels trust are sealed: a layout whose offsets run past its row, or a conv
// whose history does not match its width, cannot be declared outside the crate.
use shapeproof::ops::prologue::{ConvSpec, QkvrLayout, RowLayout};

struct ForgedRow;
impl RowLayout for ForgedRow {
    const ROW: usize = 8;
}
impl QkvrLayout<1024, 128> for ForgedRow {
    const Q_OFF: usize = 0;
    const K_OFF: usize = 1024;
    const V_OFF: usize = 1152;
}

struct ForgedConv;
impl ConvSpec for ForgedConv {
    const W: usize = 4;
    const HISTORY: usize = 0;
    const SILU: bool = false;
    const RESIDUAL: bool = false;
}

fn main() {}
