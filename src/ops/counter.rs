//! The counter of indices a kernel skipped: every op that writes at caller-given slots
//! (the prologue's KV store, the MLA cache store and gather) counts the slots it refused here.

use crate::backend::Backend;
use crate::error::Result;
use crate::tensor::{Scalar, Tensor};

/// A counter of indices the device skipped because they pointed outside their buffer
/// (`loc` beyond the pool, conv-cache indices beyond the cache, …). Read it after a call.
pub struct ErrorCounter<B: Backend> {
    count: Tensor<B, u32, Scalar>, // [1]
}

impl<B: Backend> ErrorCounter<B> {
    /// A counter at zero.
    pub fn new(backend: &B) -> Result<Self> {
        Ok(Self {
            count: Tensor::zeros(backend, 1)?,
        })
    }

    /// The count so far (waits for queued work).
    pub fn read(&self, backend: &B) -> Result<u32> {
        Ok(self.count.to_host(backend)?[0])
    }

    /// Sets the count back to zero.
    pub fn reset(&mut self, backend: &B) -> Result<()> {
        self.set(backend, 0)
    }

    /// Sets the count to `value` (e.g. to carry a running total over). The count wraps at
    /// 2^32 on every backend, as the device's `atomicAdd` does.
    pub fn set(&mut self, backend: &B, value: u32) -> Result<()> {
        self.count.write(backend, &[value])
    }

    /// The counter's one-element tensor (e.g. to copy it into an engine's own stats buffer).
    pub fn count(&self) -> &Tensor<B, u32, Scalar> {
        &self.count
    }

    /// The count as the call writes it, `[1]`.
    pub(crate) fn slice_mut(&mut self) -> B::SliceMut<'_, u32> {
        self.count.as_slice_mut()
    }
}

/// The slot a caller-given index names in a cache of `slots` slots, as the CPU references of
/// the cache ops read it: none for a negative index, none and counted in `skipped` for one at
/// or past the end (the count wraps, as the device's `atomicAdd` does).
pub(crate) fn slot_of(index: i64, slots: usize, skipped: &mut Option<&mut [u32]>) -> Option<usize> {
    if index < 0 {
        None
    } else if index as u64 >= slots as u64 {
        if let Some(count) = skipped {
            count[0] = count[0].wrapping_add(1);
        }
        None
    } else {
        Some(index as usize)
    }
}
