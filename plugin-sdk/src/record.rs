//! Typed records: a table's record is a `#[repr(C)]` struct of plain data
//! (for BPF probes, the one the skeleton generates from the `.h` shared with
//! the kernel), pushed into and read from the host's byte batches whole,
//! never written byte by byte at offsets.

use kernmlops_plugin_api::Batch;

/// A record type whose bytes are its value.
///
/// # Safety
/// Implement only for `#[repr(C)]` types (or primitives) with no padding
/// bytes (pad explicitly with fields) and for which every bit pattern is a
/// valid value: integers, floats, byte arrays, and structs and arrays of
/// those. `bool` and references are not.
pub unsafe trait Record: Copy + Send + 'static {}

// SAFETY: primitives without padding, valid for every bit pattern.
unsafe impl Record for u8 {}
// SAFETY: as above.
unsafe impl Record for u16 {}
// SAFETY: as above.
unsafe impl Record for u32 {}
// SAFETY: as above.
unsafe impl Record for u64 {}
// SAFETY: as above.
unsafe impl Record for i32 {}
// SAFETY: as above.
unsafe impl Record for i64 {}
// SAFETY: as above.
unsafe impl Record for f64 {}

/// The bytes of a record, as a batch holds them.
pub fn bytes_of<R: Record>(r: &R) -> &[u8] {
    // SAFETY: `Record` types have no padding, so all `size_of::<R>()` bytes
    // are initialised; the slice borrows `r`.
    unsafe { std::slice::from_raw_parts((r as *const R).cast::<u8>(), std::mem::size_of::<R>()) }
}

fn bytes_of_slice<R: Record>(rs: &[R]) -> &[u8] {
    // SAFETY: as in `bytes_of`, for a contiguous slice of such values.
    unsafe { std::slice::from_raw_parts(rs.as_ptr().cast::<u8>(), std::mem::size_of_val(rs)) }
}

/// Typed access to a [`Batch`] of records of one type.
pub trait BatchExt {
    /// Appends one record.
    fn push_record<R: Record>(&mut self, record: &R);

    /// Appends one record made of several values laid out back to back
    /// (for tables whose layout is decided at run time, such as a
    /// timestamp followed by one `u64` per counter).
    fn push_record_of<R: Record>(&mut self, values: &[R]);

    /// Copies of the records, for records of type `R` (the batch's buffer
    /// has no alignment, so records are read, never borrowed).
    fn records<R: Record>(&self) -> Vec<R>;

    /// Calls `f` on each record and writes the result back.
    fn update_records<R: Record>(&mut self, f: impl FnMut(&mut R));
}

impl BatchExt for Batch {
    fn push_record<R: Record>(&mut self, record: &R) {
        self.data.extend_from_slice(bytes_of(record));
        self.records += 1;
    }

    fn push_record_of<R: Record>(&mut self, values: &[R]) {
        self.data.extend_from_slice(bytes_of_slice(values));
        self.records += 1;
    }

    fn records<R: Record>(&self) -> Vec<R> {
        self.data
            .chunks_exact(std::mem::size_of::<R>())
            // SAFETY: each chunk holds size_of::<R>() bytes and every bit
            // pattern is a valid `R`; read_unaligned needs no alignment.
            .map(|c| unsafe { std::ptr::read_unaligned(c.as_ptr().cast::<R>()) })
            .collect()
    }

    fn update_records<R: Record>(&mut self, mut f: impl FnMut(&mut R)) {
        let size = std::mem::size_of::<R>();
        for chunk in self.data.chunks_exact_mut(size) {
            // SAFETY: as in `records`.
            let mut r = unsafe { std::ptr::read_unaligned(chunk.as_ptr().cast::<R>()) };
            f(&mut r);
            chunk.copy_from_slice(bytes_of(&r));
        }
    }
}

/// Copies `text` into a fixed-size `char` array as libbpf-cargo generates
/// it (`[i8; N]`), cut to the array's size, the rest zeroed. A text that
/// fills the array has no NUL: `str` columns end at the first NUL or at the
/// array's end.
pub fn set_c_chars(field: &mut [i8], text: &[u8]) {
    field.fill(0);
    let n = text.len().min(field.len());
    for (dst, &b) in field.iter_mut().zip(&text[..n]) {
        *dst = b as i8;
    }
}

/// The bytes of a fixed-size `char` array up to its first NUL.
pub fn c_chars(field: &[i8]) -> Vec<u8> {
    field
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq)]
    struct Ev {
        ts: u64,
        pid: u32,
        name: [i8; 4],
    }
    // SAFETY: repr(C), no padding (8 + 4 + 4), integers only.
    unsafe impl Record for Ev {}

    #[test]
    fn records_round_trip_through_a_batch() {
        let mut b = Batch::default();
        let mut name = [0i8; 4];
        set_c_chars(&mut name, b"abcdef");
        b.push_record(&Ev {
            ts: 1,
            pid: 2,
            name,
        });
        b.push_record(&Ev {
            ts: 3,
            pid: 4,
            name: [0; 4],
        });
        assert_eq!(b.records, 2);
        assert_eq!(b.data.len(), 32);
        b.update_records(|e: &mut Ev| e.pid += 10);
        let back: Vec<Ev> = b.records();
        assert_eq!(back[0].pid, 12);
        assert_eq!(back[1].ts, 3);
        assert_eq!(c_chars(&back[0].name), b"abcd");
        // Little-endian on the wire, as the host decodes.
        assert_eq!(&b.data[8..12], &12u32.to_le_bytes());
    }

    #[test]
    fn a_record_of_values_is_one_record() {
        let mut b = Batch::default();
        b.push_record_of(&[7u64, 8, 9]);
        assert_eq!((b.records, b.data.len()), (1, 24));
    }
}
