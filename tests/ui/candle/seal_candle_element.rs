// The candle interop lends candle storage as views of an element type and a backend; both
// traits are sealed, so a type whose storage candle does not hold cannot be lent as one.
use shapeproof::candle::CandleElement;

#[derive(Clone, Copy, Default, Debug)]
struct Fake(u16);

impl CandleElement for Fake {
    const DTYPE: candle_core::DType = candle_core::DType::U32;
    const EXPECTED: &'static str = "dtype U32";
    fn cpu(_: &candle_core::CpuStorage) -> Option<&[Self]> {
        None
    }
    fn cpu_mut(_: &mut candle_core::CpuStorage) -> Option<&mut [Self]> {
        None
    }
    fn cpu_storage(_: Vec<Self>) -> candle_core::CpuStorage {
        unreachable!()
    }
}

fn main() {}
