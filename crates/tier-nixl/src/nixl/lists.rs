//! Owners of the lists and parameter sets the C API hands out or takes: each destroyed on drop.

use std::ptr;

use super::{check, sys, Desc, MemKind, NixlError};

pub(super) struct StringList(pub(super) sys::string_list_t);
impl Drop for StringList {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: owned handle.
            unsafe { sys::nixl_capi_destroy_string_list(self.0) };
        }
    }
}

pub(super) struct Params(pub(super) sys::params_t);
impl Drop for Params {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: owned handle.
            unsafe { sys::nixl_capi_destroy_params(self.0) };
        }
    }
}

pub(super) struct RegList(pub(super) sys::reg_dlist_t);
impl RegList {
    pub(super) fn new(kind: MemKind, descs: &[Desc<'_>]) -> Result<Self, NixlError> {
        let mut raw = ptr::null_mut();
        // SAFETY: `raw` receives an owned list.
        check("nixl_capi_create_reg_dlist", unsafe {
            sys::nixl_capi_create_reg_dlist(kind.raw(), &mut raw)
        })?;
        let list = Self(raw);
        for d in descs {
            let meta = if d.meta.is_empty() {
                ptr::null()
            } else {
                d.meta.as_ptr().cast()
            };
            // SAFETY: live list; NIXL copies the metadata bytes.
            check("nixl_capi_reg_dlist_add_desc", unsafe {
                sys::nixl_capi_reg_dlist_add_desc(
                    list.0,
                    d.addr,
                    d.len,
                    d.dev_id,
                    meta,
                    d.meta.len(),
                )
            })?;
        }
        Ok(list)
    }
}
impl Drop for RegList {
    fn drop(&mut self) {
        // SAFETY: owned handle.
        unsafe { sys::nixl_capi_destroy_reg_dlist(self.0) };
    }
}

pub(super) struct XferList(pub(super) sys::xfer_dlist_t);
impl XferList {
    pub(super) fn new(kind: MemKind, descs: &[Desc<'_>]) -> Result<Self, NixlError> {
        let mut raw = ptr::null_mut();
        // SAFETY: `raw` receives an owned list.
        check("nixl_capi_create_xfer_dlist", unsafe {
            sys::nixl_capi_create_xfer_dlist(kind.raw(), &mut raw)
        })?;
        let list = Self(raw);
        for d in descs {
            // SAFETY: live list.
            check("nixl_capi_xfer_dlist_add_desc", unsafe {
                sys::nixl_capi_xfer_dlist_add_desc(list.0, d.addr, d.len, d.dev_id)
            })?;
        }
        Ok(list)
    }
}
impl Drop for XferList {
    fn drop(&mut self) {
        // SAFETY: owned handle; NIXL copied the list into any request made from it.
        unsafe { sys::nixl_capi_destroy_xfer_dlist(self.0) };
    }
}

pub(super) struct QueryResp(pub(super) sys::query_resp_list_t);
impl Drop for QueryResp {
    fn drop(&mut self) {
        // SAFETY: owned handle.
        unsafe { sys::nixl_capi_destroy_query_resp_list(self.0) };
    }
}
