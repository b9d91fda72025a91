//! The memory a flow table's entries live in: an anonymous block in
//! transparent huge pages (a table that ends with its process), or a file
//! mapped shared (a table that outlives it: the file holds a header page,
//! then the entries, then their cold parts, and a later process maps the
//! same bytes).
//!
//! Invariants: a [`Region`] is `len` values of `T` at a fixed address for
//! its whole life (it never grows or moves); a file holds a pair of
//! regions ([`Region::file_pair`]): the first's values start one header
//! page ([`HEADER`] bytes) into the file, the second's at the first page
//! boundary after them, and the file is exactly
//! [`Region::pair_bytes`] long. Values of a file region are
//! whatever the file holds: the caller validates what it reads before it
//! treats them as `T` (see `slab::sanitise`), and `T` must be plain old
//! data but for that validation.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::ptr::NonNull;

use allocator_api2::vec::Vec;

use crate::huge::HugePages;

/// Bytes before the first value of a file region.
pub(crate) const HEADER: usize = 4096;

enum Owner<T> {
    /// The anonymous block (its buffer never moves).
    Anon(#[allow(dead_code)] Vec<T, HugePages>),
    /// The file mapping: base address and length, and the file.
    File {
        base: NonNull<u8>,
        len: usize,
        _file: File,
    },
}

/// `len` values at a fixed address.
pub(crate) struct Region<T> {
    ptr: NonNull<T>,
    len: usize,
    owner: Owner<T>,
}

// SAFETY: a Region owns its memory exclusively (the file mapping is shared
// with other processes only across a restart, never with a live one: the
// instance lock), so it moves between threads like a Vec.
unsafe impl<T: Send> Send for Region<T> {}

impl<T: Copy> Region<T> {
    /// `len` copies of `fill` in huge-page-advised anonymous memory.
    pub(crate) fn anonymous(len: usize, fill: T) -> Region<T> {
        let mut v = Vec::with_capacity_in(len, HugePages);
        v.resize(len, fill);
        Region {
            ptr: NonNull::new(v.as_mut_ptr()).unwrap_or(NonNull::dangling()),
            len,
            owner: Owner::Anon(v),
        }
    }

    /// The length of the file a pair of regions of `len` values each,
    /// `T` then `U`, takes (see the module docs).
    pub(crate) fn pair_bytes<U>(len: usize) -> u64 {
        (Self::second_offset(len) + len * std::mem::size_of::<U>()) as u64
    }

    /// Where the second region of a pair starts in its file.
    fn second_offset(len: usize) -> usize {
        (HEADER + len * std::mem::size_of::<T>()).next_multiple_of(HEADER)
    }

    /// Maps `path` (created, or resized and zeroed when its length is not
    /// the one a pair of `len` values takes) shared, as `len` values of
    /// `T` after a header page and `len` values of `U` after them.
    /// Returns the two regions and the length the file had (its bytes are
    /// kept when it is this one).
    pub(crate) fn file_pair<U: Copy>(
        path: &Path,
        len: usize,
    ) -> std::io::Result<(Region<T>, Region<U>, u64)> {
        let bytes = Self::pair_bytes::<U>(len);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)?;
        let had = file.metadata()?.len();
        if had != bytes {
            file.set_len(0)?;
            file.set_len(bytes)?;
        }
        let second = Self::second_offset(len);
        let first = map(
            &file,
            0,
            HEADER + len * std::mem::size_of::<T>(),
            HEADER,
            len,
        )?;
        let second = map(&file, second, len * std::mem::size_of::<U>(), 0, len)?;
        Ok((first, second, had))
    }

    /// The header page of a file region.
    pub(crate) fn header(&mut self) -> Option<&mut [u8; HEADER]> {
        match &mut self.owner {
            Owner::Anon(_) => None,
            // The values start past the mapping's start only in the
            // mapping that begins with the header page (`map`'s `skip`).
            Owner::File { base, .. } if self.ptr.cast::<u8>() != *base => {
                // SAFETY: the mapping starts with HEADER bytes, exclusively
                // ours through `&mut self`.
                Some(unsafe { &mut *base.as_ptr().cast::<[u8; HEADER]>() })
            }
            Owner::File { .. } => None,
        }
    }

    /// The raw address of value `i` (for validation before it is read
    /// as a `T`).
    pub(crate) fn raw(&mut self, i: usize) -> *mut T {
        assert!(i < self.len);
        // SAFETY: in bounds, checked above.
        unsafe { self.ptr.as_ptr().add(i) }
    }
}

impl<T> std::ops::Deref for Region<T> {
    type Target = [T];

    #[inline(always)]
    fn deref(&self) -> &[T] {
        // SAFETY: `len` initialised values at `ptr`, alive as long as
        // `self` (the invariant; file values are validated at adoption).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> std::ops::DerefMut for Region<T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in Deref, and exclusive through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> Drop for Region<T> {
    fn drop(&mut self) {
        if let Owner::File { base, len, .. } = &self.owner {
            // SAFETY: unmaps exactly the mapping made in `file`; the
            // bytes stay in the file.
            unsafe { libc::munmap(base.as_ptr().cast(), *len) };
        }
    }
}

/// Maps `bytes` of `file` from `offset` (page-aligned) shared, as a region
/// of `len` values of `T` starting `skip` bytes in (0, or [`HEADER`] for a
/// mapping that starts with the header page).
fn map<T>(
    file: &File,
    offset: usize,
    bytes: usize,
    skip: usize,
    len: usize,
) -> std::io::Result<Region<T>> {
    // A mapping is never empty (a zero-capacity table maps one page past
    // its values and reads none of it).
    let bytes = bytes.max(1);
    // SAFETY: a shared mapping of the file, at an address the kernel
    // picks; no existing memory is affected.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            offset as libc::off_t,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: advice on the mapping just made (huge pages where the
    // filesystem offers them: tmpfs mounted with huge=).
    unsafe { libc::madvise(base, bytes, libc::MADV_HUGEPAGE) };
    let base = NonNull::new(base.cast::<u8>()).ok_or(std::io::ErrorKind::InvalidData)?;
    // SAFETY: `skip` (0 or HEADER) is within the mapping (or its end, for
    // no values) and page-aligned, so the values start aligned for any T
    // of alignment up to a page.
    let ptr = unsafe { NonNull::new_unchecked(base.as_ptr().add(skip).cast::<T>()) };
    Ok(Region {
        ptr,
        len,
        owner: Owner::File {
            base,
            len: bytes,
            _file: file.try_clone()?,
        },
    })
}
