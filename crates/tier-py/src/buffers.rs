//! Turning Python page objects into memory regions, without copying.
//!
//! A page is given as one region or a list of regions; a region is either an object with the
//! buffer protocol and format `B` or `b` (bytes, bytearray, `memoryview(x).cast("B")`, a `uint8`
//! numpy array) or a raw `(address, length)` pair for memory the caller owns (an engine's host
//! pool). Every object a region comes from is held, and so kept alive, for as long as kvtier
//! touches its memory: a buffer by its export (which also keeps a `bytearray` or a numpy array
//! from being resized meanwhile), a tensor by a reference to it and its storage. A tensor whose
//! storage torch may reallocate (a resizable one: `torch.empty`) is not lent at all: a put
//! copies it, a read lands in kvtier's own bytes and is copied into the tensor, with the GIL,
//! when the call ends ([`Lent::settle`]).

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use tier_core::{Lookup, Page, PageKey, ReadSlot, TierError};

use crate::errors::buffer_error;

/// One page's regions: (address, length) each, in order.
pub type Regions = Vec<(usize, usize)>;

/// Regions of every page of a call, and the buffer exports that keep them valid.
#[derive(Default)]
pub struct Lent {
    /// Per page, its regions.
    pub pages: Vec<Regions>,
    /// Held until the call returns.
    guards: Vec<Export>,
    /// Tensors lent in place and their storages (which cannot be resized), held likewise.
    held: Vec<PyObject>,
    /// kvtier's own bytes standing in for tensors whose memory may move.
    staged: Vec<Staged>,
}

/// Owned bytes in place of a tensor's memory: a put's copy of it, or where a read lands before
/// [`Lent::settle`] copies it into the tensor (`into`).
struct Staged {
    page: usize,
    key: String,
    into: Option<PyObject>,
    bytes: Box<[u8]>,
}

/// A buffer export of bytes, unsigned (`B`) or signed (`b`, as vLLM's KV views are).
enum Export {
    Unsigned(PyBuffer<u8>),
    Signed(PyBuffer<i8>),
}

impl Export {
    fn get(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        match PyBuffer::<u8>::get(obj) {
            Ok(buf) => Ok(Export::Unsigned(buf)),
            Err(e) => PyBuffer::<i8>::get(obj).map(Export::Signed).map_err(|_| e),
        }
    }

    fn region(&self) -> (usize, usize) {
        match self {
            Export::Unsigned(b) => (b.buf_ptr() as usize, b.len_bytes()),
            Export::Signed(b) => (b.buf_ptr() as usize, b.len_bytes()),
        }
    }

    fn is_c_contiguous(&self) -> bool {
        match self {
            Export::Unsigned(b) => b.is_c_contiguous(),
            Export::Signed(b) => b.is_c_contiguous(),
        }
    }

    fn readonly(&self) -> bool {
        match self {
            Export::Unsigned(b) => b.readonly(),
            Export::Signed(b) => b.readonly(),
        }
    }
}

impl Lent {
    /// Reads `objs` (one per key); `writable` for buffers kvtier writes into.
    pub fn parse(
        py: Python<'_>,
        keys: &[String],
        objs: &[Bound<'_, PyAny>],
        writable: bool,
    ) -> PyResult<Self> {
        if keys.len() != objs.len() {
            return Err(buffer_error(
                py,
                None,
                format!("{} keys but {} pages or buffers", keys.len(), objs.len()),
            ));
        }
        let mut lent = Lent::default();
        for (page, (key, obj)) in keys.iter().zip(objs).enumerate() {
            let mut regions = Vec::new();
            if let Ok(list) = obj.downcast::<PyList>() {
                for item in list.iter() {
                    regions.push(lent.region(py, page, key, &item, writable)?);
                }
            } else {
                regions.push(lent.region(py, page, key, obj, writable)?);
            }
            lent.pages.push(regions);
        }
        if writable {
            check_disjoint(py, keys, &lent.pages)?;
        }
        Ok(lent)
    }

    /// Raw regions of host memory the caller keeps valid for the call: `addresses` and
    /// `lengths` hold the same number of regions per key, consecutive per page.
    pub fn raw(
        py: Python<'_>,
        keys: &[String],
        addresses: Vec<usize>,
        lengths: Vec<usize>,
        writable: bool,
    ) -> PyResult<Self> {
        if addresses.len() != lengths.len() {
            return Err(buffer_error(
                py,
                None,
                format!(
                    "{} addresses but {} lengths",
                    addresses.len(),
                    lengths.len()
                ),
            ));
        }
        let per = if keys.is_empty() {
            0
        } else {
            addresses.len() / keys.len()
        };
        if per * keys.len() != addresses.len() || (per == 0 && !addresses.is_empty()) {
            return Err(buffer_error(
                py,
                None,
                format!(
                    "{} regions do not divide evenly among {} keys",
                    addresses.len(),
                    keys.len()
                ),
            ));
        }
        let mut lent = Lent::default();
        for (n, key) in keys.iter().enumerate() {
            let mut regions = Vec::with_capacity(per);
            for i in n * per..(n + 1) * per {
                regions.push(raw_region(py, key, addresses[i], lengths[i])?);
            }
            lent.pages.push(regions);
        }
        if writable {
            check_disjoint(py, keys, &lent.pages)?;
        }
        Ok(lent)
    }

    fn region(
        &mut self,
        py: Python<'_>,
        page: usize,
        key: &str,
        obj: &Bound<'_, PyAny>,
        writable: bool,
    ) -> PyResult<(usize, usize)> {
        if let Ok(pair) = obj.downcast::<PyTuple>() {
            let (addr, len): (usize, usize) = pair.extract().map_err(|_| {
                buffer_error(
                    py,
                    Some(key),
                    "a raw region is a tuple (address: int, length: int)".into(),
                )
            })?;
            return raw_region(py, key, addr, len);
        }
        // The buffer protocol is asked first: a buffer of bytes (what engines pass per page)
        // then costs no attribute lookup, and a tensor has no buffer protocol.
        let buf = match Export::get(obj) {
            Ok(buf) => Ok(buf),
            Err(_) if is_tensor(obj)? => {
                return self.tensor_region(py, page, key, obj, writable);
            }
            Err(refused) => as_bytes(py, obj, refused),
        };
        let buf = buf.map_err(|e| {
            buffer_error(
                py,
                Some(key),
                format!(
                    "expected a buffer of bytes (format 'B' or 'b'), a list of them, or (address, length): {e}"
                ),
            )
        })?;
        if !buf.is_c_contiguous() {
            return Err(buffer_error(
                py,
                Some(key),
                "the buffer is not contiguous".into(),
            ));
        }
        if writable && buf.readonly() {
            return Err(buffer_error(
                py,
                Some(key),
                "the buffer is read-only; get_into needs a writable one".into(),
            ));
        }
        let region = buf.region();
        self.guards.push(buf);
        Ok(region)
    }
}

/// A buffer of wider items (float16 pages, say) viewed as its bytes; `refused` (why it is no
/// buffer of bytes) if it cannot be.
fn as_bytes(py: Python<'_>, obj: &Bound<'_, PyAny>, refused: PyErr) -> PyResult<Export> {
    let view = py
        .import("builtins")?
        .getattr("memoryview")?
        .call1((obj,))?;
    let bytes = view.call_method1("cast", ("B",)).map_err(|_| refused)?;
    Export::get(&bytes)
}

/// Whether `obj` is a tensor (has `data_ptr` and `is_contiguous`) rather than a buffer.
fn is_tensor(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    Ok(obj.hasattr("data_ptr")? && obj.hasattr("is_contiguous")?)
}

/// A tensor's memory now, as `(address, length)`: host memory only, contiguous, its length
/// (`numel * element_size`) representable.
fn tensor_memory(py: Python<'_>, key: &str, obj: &Bound<'_, PyAny>) -> PyResult<(usize, usize)> {
    if let Ok(device) = obj.getattr("device") {
        if !device.is_none() {
            let kind: String = device.getattr("type")?.extract()?;
            if kind != "cpu" {
                return Err(buffer_error(
                    py,
                    Some(key),
                    format!("a tensor on {} is not host memory", device.str()?),
                ));
            }
        }
    }
    if !obj.call_method0("is_contiguous")?.is_truthy()? {
        return Err(buffer_error(
            py,
            Some(key),
            "the tensor is not contiguous".into(),
        ));
    }
    let addr: usize = obj.call_method0("data_ptr")?.extract()?;
    let items: usize = obj.call_method0("numel")?.extract()?;
    let size: usize = obj.call_method0("element_size")?.extract()?;
    let len = items.checked_mul(size).ok_or_else(|| {
        buffer_error(
            py,
            Some(key),
            format!("a tensor of {items} items of {size} bytes is larger than memory"),
        )
    })?;
    raw_region(py, key, addr, len)
}

/// The storage of `tensor` when torch cannot reallocate it (not resizable), so that holding
/// it pins the memory; `None` for a resizable storage or an object without one.
fn fixed_storage<'py>(tensor: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
    if !tensor.hasattr("untyped_storage")? {
        return Ok(None);
    }
    let storage = tensor.call_method0("untyped_storage")?;
    let resizable = storage.call_method0("resizable")?.is_truthy()?;
    Ok((!resizable).then_some(storage))
}

impl Lent {
    /// A tensor's region: its own memory when that is pinned (a fixed storage, held with the
    /// tensor), else kvtier's staged bytes.
    fn tensor_region(
        &mut self,
        py: Python<'_>,
        page: usize,
        key: &str,
        obj: &Bound<'_, PyAny>,
        writable: bool,
    ) -> PyResult<(usize, usize)> {
        let (addr, len) = tensor_memory(py, key, obj)?;
        if let Some(storage) = fixed_storage(obj)? {
            if writable && !mapped_writable(addr, len) {
                return Err(buffer_error(
                    py,
                    Some(key),
                    "the tensor's memory is read-only; get_into needs writable memory".into(),
                ));
            }
            self.held.push(obj.clone().unbind());
            self.held.push(storage.unbind());
            return Ok((addr, len));
        }
        let (bytes, into) = if writable {
            (
                vec![0u8; len].into_boxed_slice(),
                Some(obj.clone().unbind()),
            )
        } else {
            // SAFETY: `tensor_memory` just read the tensor's host memory range with the GIL
            // held; it is copied before this thread lets go of the GIL.
            let now = unsafe { slice_at(addr, len) };
            (Box::from(now), None)
        };
        let region = (bytes.as_ptr() as usize, bytes.len());
        self.staged.push(Staged {
            page,
            key: key.to_owned(),
            into,
            bytes,
        });
        Ok(region)
    }

    /// Ends a read: copies each hit's staged bytes into its tensor (with the GIL, so the
    /// tensor's memory is looked up afresh). Per page, the error that replaces its result: a
    /// tensor resized or moved off the host during the call.
    pub fn settle(
        &self,
        py: Python<'_>,
        results: &[Result<Lookup, TierError>],
    ) -> Vec<Option<PyErr>> {
        let mut errors: Vec<Option<PyErr>> = (0..results.len()).map(|_| None).collect();
        for staged in &self.staged {
            let Some(tensor) = &staged.into else { continue };
            let page = staged.page;
            if !matches!(results.get(page), Some(Ok(Lookup::Hit))) || errors[page].is_some() {
                continue;
            }
            let key = staged.key.as_str();
            match tensor_memory(py, key, tensor.bind(py)) {
                Ok((addr, len)) if len == staged.bytes.len() => {
                    // SAFETY: the tensor's current host memory, looked up just now with the GIL
                    // held, `len` bytes; the staged bytes are kvtier's own.
                    unsafe {
                        std::ptr::copy_nonoverlapping(staged.bytes.as_ptr(), addr as *mut u8, len)
                    };
                }
                Ok((_, len)) => {
                    errors[page] = Some(buffer_error(
                        py,
                        Some(key),
                        format!(
                            "the tensor was resized during the call ({} bytes, now {len})",
                            staged.bytes.len()
                        ),
                    ));
                }
                Err(e) => errors[page] = Some(e),
            }
        }
        errors
    }
}

/// `len` bytes at `addr` (an empty slice for `len` 0, whatever the address).
///
/// # Safety
///
/// Unless `len` is 0, the range must be readable memory that stays valid and unwritten for
/// `'a`.
unsafe fn slice_at<'a>(addr: usize, len: usize) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: the caller's contract; `addr` is not null (`raw_region` refuses it).
    unsafe { std::slice::from_raw_parts(addr as *const u8, len) }
}

/// `len` writable bytes at `addr` (an empty slice for `len` 0, whatever the address).
///
/// # Safety
///
/// Unless `len` is 0, the range must be writable memory that stays valid for `'a` and is
/// touched by nothing else meanwhile.
unsafe fn slice_at_mut<'a>(addr: usize, len: usize) -> &'a mut [u8] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: the caller's contract; `addr` is not null (`raw_region` refuses it).
    unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) }
}

/// Whether every byte of `[addr, addr + len)` lies in mappings this process may write
/// (from `/proc/self/maps`), so a read into it cannot fault.
fn mapped_writable(addr: usize, len: usize) -> bool {
    if len == 0 {
        return true;
    }
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return false;
    };
    let end = addr.saturating_add(len);
    let mut covered = addr;
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
        else {
            continue;
        };
        if hi <= covered || lo > covered {
            continue;
        }
        if !perms.starts_with("rw") {
            return false;
        }
        covered = hi;
        if covered >= end {
            return true;
        }
    }
    false
}

/// Checks one raw region: not at address 0, not wrapping the address space.
fn raw_region(py: Python<'_>, key: &str, addr: usize, len: usize) -> PyResult<(usize, usize)> {
    if addr == 0 && len > 0 {
        return Err(buffer_error(
            py,
            Some(key),
            "a raw region at address 0".into(),
        ));
    }
    if addr.checked_add(len).is_none() {
        return Err(buffer_error(
            py,
            Some(key),
            format!("raw region ({addr:#x}, {len}) wraps the address space"),
        ));
    }
    Ok((addr, len))
}

/// Buffers written by one call must not overlap (two pages into the same bytes).
fn check_disjoint(py: Python<'_>, keys: &[String], pages: &[Regions]) -> PyResult<()> {
    let mut all: Vec<(usize, usize, usize)> = pages
        .iter()
        .enumerate()
        .flat_map(|(page, regions)| regions.iter().map(move |&(a, l)| (a, l, page)))
        .filter(|&(_, len, _)| len > 0)
        .collect();
    all.sort_unstable();
    for pair in all.windows(2) {
        let ((a, len, page), (b, _, _)) = (pair[0], pair[1]);
        if a + len > b {
            return Err(buffer_error(
                py,
                Some(&keys[page]),
                "buffers of one get_into call overlap".into(),
            ));
        }
    }
    Ok(())
}

/// Pages of `keys`, each over its regions, borrowing the memory.
///
/// # Safety
///
/// Every region must be readable memory that stays valid and unwritten for `'a`: a live
/// buffer export held at least as long, or host memory the caller vouches for.
pub unsafe fn lent_pages<'a>(keys: &[PageKey], regions: &[Regions]) -> Vec<Page<'a>> {
    keys.iter()
        .zip(regions)
        .map(|(key, regions)| {
            Page::lent(
                key.clone(),
                regions.iter().map(|&(addr, len)| {
                    // SAFETY: the caller's contract above.
                    unsafe { slice_at(addr, len) }
                }),
            )
        })
        .collect()
}

/// Read slots of `keys`, each filling its regions in order.
///
/// # Safety
///
/// Every region must be writable memory that stays valid for `'a`, disjoint from the others
/// (as [`Lent`] checks), and touched by nothing else meanwhile.
pub unsafe fn read_slots<'a>(keys: &[PageKey], regions: &[Regions]) -> Vec<ReadSlot<'a>> {
    keys.iter()
        .zip(regions)
        .map(|(key, regions)| {
            ReadSlot::regions(
                key.clone(),
                regions
                    .iter()
                    .map(|&(addr, len)| {
                        // SAFETY: the caller's contract above.
                        unsafe { slice_at_mut(addr, len) }
                    })
                    .collect(),
            )
        })
        .collect()
}
