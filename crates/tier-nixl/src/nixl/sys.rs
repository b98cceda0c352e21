//! Raw declarations of the NIXL C API symbols kvtier uses, as `wrapper.h` of nixl-sys 1.5
//! declares them. nixl-sys keeps its own bindings and agent handle private, so registrations
//! with metaInfo (path mode, object keys) are only reachable through these.
//!
//! Nothing outside [`super`] touches these; every handle they return is owned by an RAII type
//! there.
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_void};

pub type status_t = c_int;
pub type mem_type_t = c_int;
pub type xfer_op_t = c_int;

pub const SUCCESS: status_t = 0;
pub const IN_PROG: status_t = 1;

pub const MEM_DRAM: mem_type_t = 0;
pub const MEM_OBJECT: mem_type_t = 3;
pub const MEM_FILE: mem_type_t = 4;

pub const XFER_READ: xfer_op_t = 0;
pub const XFER_WRITE: xfer_op_t = 1;

pub const THREAD_SYNC_RW: c_int = 2;

macro_rules! opaque {
    ($($name:ident),*) => {$(
        #[repr(C)]
        pub struct $name {
            _private: [u8; 0],
        }
    )*};
}
opaque!(
    agent_s,
    params_s,
    mem_list_s,
    string_list_s,
    backend_s,
    opt_args_s,
    xfer_dlist_s,
    reg_dlist_s,
    xfer_req_s,
    query_resp_list_s
);

pub type agent_t = *mut agent_s;
pub type params_t = *mut params_s;
pub type mem_list_t = *mut mem_list_s;
pub type string_list_t = *mut string_list_s;
pub type backend_t = *mut backend_s;
pub type opt_args_t = *mut opt_args_s;
pub type xfer_dlist_t = *mut xfer_dlist_s;
pub type reg_dlist_t = *mut reg_dlist_s;
pub type xfer_req_t = *mut xfer_req_s;
pub type query_resp_list_t = *mut query_resp_list_s;

#[repr(C)]
pub struct agent_config_t {
    pub enable_prog_thread: bool,
    pub enable_listen_thread: bool,
    pub listen_port: c_int,
    pub thread_sync: c_int,
    pub num_workers: c_uint,
    pub pthr_delay_us: u64,
    pub lthr_delay_us: u64,
    pub capture_telemetry: bool,
}

extern "C" {
    pub fn nixl_capi_is_stub() -> bool;

    pub fn nixl_capi_create_configured_agent(
        name: *const c_char,
        cfg: *const agent_config_t,
        agent: *mut agent_t,
    ) -> status_t;
    pub fn nixl_capi_destroy_agent(agent: agent_t) -> status_t;

    pub fn nixl_capi_get_available_plugins(agent: agent_t, plugins: *mut string_list_t)
        -> status_t;
    pub fn nixl_capi_destroy_string_list(list: string_list_t) -> status_t;
    pub fn nixl_capi_string_list_size(list: string_list_t, size: *mut usize) -> status_t;
    pub fn nixl_capi_string_list_get(
        list: string_list_t,
        index: usize,
        s: *mut *const c_char,
    ) -> status_t;

    pub fn nixl_capi_get_plugin_params(
        agent: agent_t,
        plugin: *const c_char,
        mems: *mut mem_list_t,
        params: *mut params_t,
    ) -> status_t;
    pub fn nixl_capi_destroy_mem_list(list: mem_list_t) -> status_t;
    pub fn nixl_capi_destroy_params(params: params_t) -> status_t;
    pub fn nixl_capi_params_add(
        params: params_t,
        key: *const c_char,
        value: *const c_char,
    ) -> status_t;

    pub fn nixl_capi_create_backend(
        agent: agent_t,
        plugin: *const c_char,
        params: params_t,
        backend: *mut backend_t,
    ) -> status_t;
    pub fn nixl_capi_destroy_backend(backend: backend_t) -> status_t;

    pub fn nixl_capi_create_opt_args(args: *mut opt_args_t) -> status_t;
    pub fn nixl_capi_destroy_opt_args(args: opt_args_t) -> status_t;
    pub fn nixl_capi_opt_args_add_backend(args: opt_args_t, backend: backend_t) -> status_t;

    pub fn nixl_capi_create_reg_dlist(mem_type: mem_type_t, dlist: *mut reg_dlist_t) -> status_t;
    pub fn nixl_capi_destroy_reg_dlist(dlist: reg_dlist_t) -> status_t;
    pub fn nixl_capi_reg_dlist_add_desc(
        dlist: reg_dlist_t,
        addr: usize,
        len: usize,
        dev_id: u64,
        metadata: *const c_void,
        metadata_len: usize,
    ) -> status_t;
    pub fn nixl_capi_register_mem(agent: agent_t, dlist: reg_dlist_t, args: opt_args_t)
        -> status_t;
    pub fn nixl_capi_deregister_mem(
        agent: agent_t,
        dlist: reg_dlist_t,
        args: opt_args_t,
    ) -> status_t;

    pub fn nixl_capi_create_xfer_dlist(mem_type: mem_type_t, dlist: *mut xfer_dlist_t) -> status_t;
    pub fn nixl_capi_destroy_xfer_dlist(dlist: xfer_dlist_t) -> status_t;
    pub fn nixl_capi_xfer_dlist_add_desc(
        dlist: xfer_dlist_t,
        addr: usize,
        len: usize,
        dev_id: u64,
    ) -> status_t;

    pub fn nixl_capi_create_xfer_req(
        agent: agent_t,
        op: xfer_op_t,
        local: xfer_dlist_t,
        remote: xfer_dlist_t,
        remote_agent: *const c_char,
        req: *mut xfer_req_t,
        args: opt_args_t,
    ) -> status_t;
    pub fn nixl_capi_post_xfer_req(agent: agent_t, req: xfer_req_t, args: opt_args_t) -> status_t;
    pub fn nixl_capi_get_xfer_status(agent: agent_t, req: xfer_req_t) -> status_t;
    pub fn nixl_capi_release_xfer_req(agent: agent_t, req: xfer_req_t) -> status_t;
    pub fn nixl_capi_destroy_xfer_req(req: xfer_req_t) -> status_t;

    pub fn nixl_capi_create_query_resp_list(list: *mut query_resp_list_t) -> status_t;
    pub fn nixl_capi_destroy_query_resp_list(list: query_resp_list_t) -> status_t;
    pub fn nixl_capi_query_resp_list_size(list: query_resp_list_t, size: *mut usize) -> status_t;
    pub fn nixl_capi_query_resp_list_has_value(
        list: query_resp_list_t,
        index: usize,
        has_value: *mut bool,
    ) -> status_t;
    pub fn nixl_capi_query_mem(
        agent: agent_t,
        descs: reg_dlist_t,
        resp: query_resp_list_t,
        args: opt_args_t,
    ) -> status_t;
}
