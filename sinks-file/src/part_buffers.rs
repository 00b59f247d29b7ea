//! The buffers a writer's multipart uploads fill, recycled.
//!
//! ```text
//!  take      a free buffer of the part size (allocated only when none is free)
//!  fill      the upload appends records to it, up to exactly the part size
//!  payload   it goes to the store without a copy, wrapped so that its drop brings it back
//!  drop      when the store is done with it (uploaded, failed or given up), it is emptied
//!            and kept for a later part, unless enough are kept already
//! ```
//!
//! A writer thus allocates its part buffers once, not once per part. Freeing
//! a buffer of several megabytes per part is not free with every allocator:
//! glibc's malloc raises its mmap threshold when such a buffer is freed,
//! serves the next ones from its per-thread arenas and keeps them there once
//! freed. The S3 benchmark's job held about 30 MiB more than its parts that
//! way: 71 MiB at peak, 41 MiB with buffers recycled (`docs/performance.md`).
//!
//! Made by each file writer on an object store output and shared by its
//! uploads (`upload::UploadPart`); the buffers come back from the upload
//! tasks, on whichever thread drops the payload.

use std::sync::{Arc, Mutex, PoisonError, Weak};

use bytes::Bytes;
use object_store::PutPayload;

/// One writer's part buffers: those free for a next part, at most `keep`.
#[derive(Debug, Clone)]
pub(crate) struct PartBuffers {
    part_size: usize,
    keep: usize,
    free: Arc<Mutex<Vec<Vec<u8>>>>,
    /// How many buffers were allocated (tests).
    #[cfg(test)]
    made: Arc<std::sync::atomic::AtomicUsize>,
}

impl PartBuffers {
    /// Buffers of `part_size` bytes, of which at most `keep` are kept free
    /// (more in use at once are allocated and freed as they come). A writer
    /// keeps `parts_in_flight + 1`: its parts in flight and its tail.
    pub(crate) fn new(part_size: usize, keep: usize) -> PartBuffers {
        PartBuffers {
            part_size,
            keep,
            free: Arc::new(Mutex::new(Vec::new())),
            #[cfg(test)]
            made: Arc::default(),
        }
    }

    /// The part size the buffers hold.
    pub(crate) fn part_size(&self) -> usize {
        self.part_size
    }

    /// An empty buffer that holds a part without growing: a free one, or a
    /// new one when none is free.
    pub(crate) fn take(&self) -> Vec<u8> {
        let free = self
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        free.unwrap_or_else(|| {
            #[cfg(test)]
            self.made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Vec::with_capacity(self.part_size)
        })
    }

    /// Keeps `buffer`, no longer needed, for a later part (an upload's
    /// tail when the upload ends without it), unless enough are kept or it
    /// cannot hold a part.
    pub(crate) fn put_back(&self, buffer: Vec<u8>) {
        if buffer.capacity() >= self.part_size {
            keep_free(&self.free, self.keep, buffer);
        }
    }

    /// `part` as a payload for the store, without a copy; the buffer comes
    /// back to these buffers when the payload's last clone is dropped.
    pub(crate) fn payload(&self, part: Vec<u8>) -> PutPayload {
        PutPayload::from(Bytes::from_owner(Returning {
            part,
            home: Arc::downgrade(&self.free),
            keep: self.keep,
        }))
    }

    /// How many buffers were allocated so far (tests).
    #[cfg(test)]
    pub(crate) fn made(&self) -> usize {
        self.made.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many buffers are free (tests).
    #[cfg(test)]
    fn free(&self) -> usize {
        self.free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// A part in a payload, on its way back to its writer's free buffers.
struct Returning {
    part: Vec<u8>,
    /// The writer's free buffers; gone once the writer is.
    home: Weak<Mutex<Vec<Vec<u8>>>>,
    keep: usize,
}

impl AsRef<[u8]> for Returning {
    fn as_ref(&self) -> &[u8] {
        &self.part
    }
}

impl Drop for Returning {
    fn drop(&mut self) {
        if let Some(home) = self.home.upgrade() {
            keep_free(&home, self.keep, std::mem::take(&mut self.part));
        }
    }
}

/// Adds `buffer`, emptied, to the free ones `free`, unless `keep` are free
/// already (then it is freed).
fn keep_free(free: &Mutex<Vec<Vec<u8>>>, keep: usize, mut buffer: Vec<u8>) {
    let mut free = free.lock().unwrap_or_else(PoisonError::into_inner);
    if free.len() < keep {
        buffer.clear();
        free.push(buffer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of(payload: &PutPayload) -> Vec<u8> {
        payload.iter().flat_map(|b| b.iter().copied()).collect()
    }

    #[test]
    fn a_buffer_comes_back_empty_once_its_payload_is_dropped_and_holds_the_next_part() {
        let buffers = PartBuffers::new(16, 2);
        let mut part = buffers.take();
        assert!(part.capacity() >= 16);
        part.extend_from_slice(b"first part bytes");
        let address = part.as_ptr();
        let payload = buffers.payload(part);
        let retry = payload.clone();
        assert_eq!(bytes_of(&payload), b"first part bytes");
        drop(payload);
        assert_eq!(buffers.free(), 0, "a clone still holds it");
        drop(retry);
        assert_eq!(buffers.free(), 1);

        let next = buffers.take();
        assert_eq!(next.as_ptr(), address, "the same allocation, not a new one");
        assert!(next.is_empty(), "nothing of the last part is left in it");
        assert!(next.capacity() >= 16);
    }

    #[test]
    fn a_buffer_put_back_is_taken_again() {
        let buffers = PartBuffers::new(8, 2);
        let mut tail = buffers.take();
        tail.extend_from_slice(b"left");
        let address = tail.as_ptr();
        buffers.put_back(tail);
        let next = buffers.take();
        assert_eq!((next.as_ptr(), next.len()), (address, 0));
        assert_eq!(buffers.made(), 1);
    }

    #[test]
    fn at_most_keep_buffers_are_kept_and_none_once_the_writer_is_gone() {
        let buffers = PartBuffers::new(8, 2);
        let payloads: Vec<_> = (0..3)
            .map(|i| {
                let mut part = buffers.take();
                part.push(i);
                buffers.payload(part)
            })
            .collect();
        drop(payloads);
        assert_eq!(buffers.free(), 2);

        buffers.put_back(Vec::new());
        assert_eq!(
            buffers.free(),
            2,
            "a buffer that cannot hold a part is not kept"
        );

        let mut part = buffers.take();
        part.push(9);
        let payload = buffers.payload(part);
        drop(buffers);
        assert_eq!(bytes_of(&payload), [9], "the payload outlives the writer");
        drop(payload);
    }
}
