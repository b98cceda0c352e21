//! Turning Python page objects into memory regions, without copying.
//!
//! A page is given as one region or a list of regions; a region is either an object with the
//! buffer protocol and format `B` or `b` (bytes, bytearray, `memoryview(x).cast("B")`, a `uint8`
//! numpy array) or a raw `(address, length)` pair for memory the caller owns (an engine's host
//! pool). Buffer objects are held (and so kept alive) until the call that uses them returns.

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use tier_core::{Page, PageKey, ReadSlot};

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
        for (key, obj) in keys.iter().zip(objs) {
            let mut regions = Vec::new();
            if let Ok(list) = obj.downcast::<PyList>() {
                for item in list.iter() {
                    regions.push(lent.region(py, key, &item, writable)?);
                }
            } else {
                regions.push(lent.region(py, key, obj, writable)?);
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
        if let Some(region) = tensor_region(py, key, obj)? {
            return Ok(region);
        }
        let buf = Export::get(obj).or_else(|e| {
            // A buffer of wider items (float16 pages, say) is viewed as its bytes.
            let bytes = py
                .import("builtins")?
                .getattr("memoryview")?
                .call1((obj,))?
                .call_method1("cast", ("B",))
                .map_err(|_| e)?;
            Export::get(&bytes)
        });
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

/// A tensor's memory as a raw region (`None` for anything without `data_ptr` and
/// `is_contiguous`): host memory only, contiguous; the caller keeps the tensor for the call.
fn tensor_region(
    py: Python<'_>,
    key: &str,
    obj: &Bound<'_, PyAny>,
) -> PyResult<Option<(usize, usize)>> {
    if !(obj.hasattr("data_ptr")? && obj.hasattr("is_contiguous")?) {
        return Ok(None);
    }
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
    raw_region(py, key, addr, items * size).map(Some)
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
                    unsafe { std::slice::from_raw_parts(addr as *const u8, len) }
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
                        unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) }
                    })
                    .collect(),
            )
        })
        .collect()
}
