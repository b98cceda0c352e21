//! The one audited place that calls NIXL. Every handle has an owner that releases it on drop:
//! [`Agent`] (the agent), [`Backend`] (a plugin instance and the opt-args naming it),
//! [`Registration`] (registered descriptors, deregistered on drop), [`Transfer`] (a transfer
//! request and everything its I/O may touch, its [`Held`]: released once it settles, leaked if
//! it never does). Callers must load the runtime ([`crate::runtime::load`]) first. No call
//! reaches NIXL once the process exits (see [`exit`]).

mod exit;
mod ios;
mod lists;
pub(crate) mod sys;
mod transfer;

pub(crate) use ios::pool_size;
use ios::IoPool;
pub use ios::IoRoom;
use lists::{Params, QueryResp, RegList, StringList, XferList};
pub use transfer::{Finished, Held, Owned, Registered, Transfer, Unsettled};

use std::collections::BTreeMap;
use std::ffi::{c_char, CStr, CString};
use std::ptr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

/// A failed NIXL call: which call and the status it returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NixlError {
    /// The C API call.
    pub call: &'static str,
    /// Its status code (negative), or 0 for a failure detected on the Rust side.
    pub status: i32,
    /// Extra context.
    pub detail: String,
}

impl std::fmt::Display for NixlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self.status {
            -1 => "INVALID_PARAM",
            -2 => "BACKEND",
            -3 => "INVALID_STATE",
            -4 => "EXCEPTION",
            -5 => "NO_TELEMETRY",
            -6 => "NOT_FOUND",
            _ => "ERROR",
        };
        write!(f, "{} returned {name} ({})", self.call, self.status)?;
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        Ok(())
    }
}

fn check(call: &'static str, status: sys::status_t) -> Result<(), NixlError> {
    if status == sys::SUCCESS {
        Ok(())
    } else {
        Err(NixlError {
            call,
            status,
            detail: String::new(),
        })
    }
}

fn cstring(call: &'static str, s: &str) -> Result<CString, NixlError> {
    CString::new(s).map_err(|_| NixlError {
        call,
        status: 0,
        detail: format!("{s:?} holds a NUL byte"),
    })
}

/// Device ids for path-mode and object registrations: unique among live registrations in the
/// process (NIXL >= 1.3.1 rejects a reused one), and above every file descriptor, the device
/// id of a file registered by its descriptor.
static NEXT_DEV_ID: AtomicU64 = AtomicU64::new(1 << 32);

/// A device id no other registration in this process uses.
pub fn next_dev_id() -> u64 {
    NEXT_DEV_ID.fetch_add(1, Relaxed)
}

/// Distinguishes agents of tiers opened in one process.
static AGENT_SEQ: AtomicU64 = AtomicU64::new(0);

/// Registrations and transfer requests alive in this process (leaked ones included).
static LIVE_REGISTRATIONS: AtomicUsize = AtomicUsize::new(0);
static LIVE_TRANSFERS: AtomicUsize = AtomicUsize::new(0);

/// NIXL registrations alive in this process now (for leak checks).
pub fn live_registrations() -> usize {
    LIVE_REGISTRATIONS.load(Relaxed)
}

/// NIXL transfer requests alive in this process now (for leak checks).
pub fn live_transfers() -> usize {
    LIVE_TRANSFERS.load(Relaxed)
}

/// Memory kinds kvtier registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemKind {
    /// Host memory (staging buffers).
    Dram,
    /// Files (FILE plugins).
    File,
    /// Objects (OBJ plugin).
    Object,
}

impl MemKind {
    fn raw(self) -> sys::mem_type_t {
        match self {
            Self::Dram => sys::MEM_DRAM,
            Self::File => sys::MEM_FILE,
            Self::Object => sys::MEM_OBJECT,
        }
    }
}

pub use tier_folder::io::XferOp;

/// One descriptor: address (or file offset), length, device id, and metaInfo bytes.
#[derive(Debug, Clone, Copy)]
pub struct Desc<'a> {
    /// Address in memory, or offset in a file.
    pub addr: usize,
    /// Length in bytes.
    pub len: usize,
    /// Device id: an fd in legacy FILE mode, a unique id in path mode.
    pub dev_id: u64,
    /// Registration metaInfo (path-mode spec or object key); empty for none.
    pub meta: &'a [u8],
}

impl Desc<'_> {
    /// Host memory: `len` bytes at `addr`.
    pub fn dram(addr: usize, len: usize) -> Self {
        Desc {
            addr,
            len,
            dev_id: 0,
            meta: &[],
        }
    }
}

/// A NIXL agent. Created with read/write thread synchronisation, so it may be shared across
/// threads.
pub struct Agent {
    raw: sys::agent_t,
    name: CString,
}

// SAFETY: the agent is created with NIXL_CAPI_THREAD_SYNC_RW: NIXL serialises access itself.
unsafe impl Send for Agent {}
// SAFETY: as above.
unsafe impl Sync for Agent {}

impl Agent {
    /// Creates an agent without progress or listener threads (local storage needs neither).
    pub fn new(name: &str) -> Result<Arc<Self>, NixlError> {
        let cname = cstring("nixl_capi_create_configured_agent", name)?;
        let _call = exit::enter_or("nixl_capi_create_configured_agent")?;
        let cfg = sys::agent_config_t {
            enable_prog_thread: false,
            enable_listen_thread: false,
            listen_port: 0,
            thread_sync: sys::THREAD_SYNC_RW,
            num_workers: 1,
            pthr_delay_us: 0,
            lthr_delay_us: 100_000,
            capture_telemetry: false,
        };
        let mut raw = ptr::null_mut();
        // SAFETY: valid C string and config; `raw` receives the handle.
        let status =
            unsafe { sys::nixl_capi_create_configured_agent(cname.as_ptr(), &cfg, &mut raw) };
        check("nixl_capi_create_configured_agent", status)?;
        exit::watch(exit::Made::Agent);
        Ok(Arc::new(Self { raw, name: cname }))
    }

    /// An agent for lane `lane` of tier `tier`, named uniquely in this process.
    pub fn for_lane(tier: &str, lane: usize) -> Result<Arc<Self>, NixlError> {
        let seq = AGENT_SEQ.fetch_add(1, Relaxed);
        Self::new(&format!(
            "kvtier-{tier}-{}-{seq}-{lane}",
            std::process::id()
        ))
    }

    /// Names of the plugins this runtime can load.
    pub fn plugins(&self) -> Result<Vec<String>, NixlError> {
        let _call = exit::enter_or("nixl_capi_get_available_plugins")?;
        let mut list = ptr::null_mut();
        // SAFETY: live agent; `list` receives an owned string list destroyed below.
        check("nixl_capi_get_available_plugins", unsafe {
            sys::nixl_capi_get_available_plugins(self.raw, &mut list)
        })?;
        let list = StringList(list);
        let mut n = 0usize;
        // SAFETY: `list.0` is live.
        check("nixl_capi_string_list_size", unsafe {
            sys::nixl_capi_string_list_size(list.0, &mut n)
        })?;
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let mut s: *const c_char = ptr::null();
            // SAFETY: i < size; the returned string lives as long as the list.
            check("nixl_capi_string_list_get", unsafe {
                sys::nixl_capi_string_list_get(list.0, i, &mut s)
            })?;
            // SAFETY: non-null C string owned by the list.
            out.push(unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned());
        }
        Ok(out)
    }

    fn plugin_param_handle(&self, plugin: &str) -> Result<Params, NixlError> {
        let cplugin = cstring("nixl_capi_get_plugin_params", plugin)?;
        let (mut mems, mut params) = (ptr::null_mut(), ptr::null_mut());
        // SAFETY: live agent, valid name; both outputs are owned and destroyed below/by Params.
        let status = unsafe {
            sys::nixl_capi_get_plugin_params(self.raw, cplugin.as_ptr(), &mut mems, &mut params)
        };
        if !mems.is_null() {
            // SAFETY: owned mem list, not used again.
            unsafe { sys::nixl_capi_destroy_mem_list(mems) };
        }
        let params = Params(params);
        check("nixl_capi_get_plugin_params", status).map_err(|e| NixlError {
            detail: format!("plugin {plugin} is not available in this runtime"),
            ..e
        })?;
        Ok(params)
    }

    /// Creates a backend of `plugin`, its default parameters overridden by `overrides`. A
    /// POSIX backend's transfers are kept within its pool of I/O requests (see [`IoRoom`]).
    pub fn create_backend(
        self: &Arc<Self>,
        plugin: &str,
        overrides: &BTreeMap<String, String>,
    ) -> Result<Arc<Backend>, NixlError> {
        let ios = match plugin {
            "POSIX" => Some(IoPool::new(ios::pool_size(
                overrides.get("ios_pool_size").map(String::as_str),
            )?)),
            _ => None,
        };
        let _call = exit::enter_or("nixl_capi_create_backend")?;
        let params = self.plugin_param_handle(plugin)?;
        for (k, v) in overrides {
            let (ck, cv) = (
                cstring("nixl_capi_params_add", k)?,
                cstring("nixl_capi_params_add", v)?,
            );
            // SAFETY: live params, valid C strings (copied by NIXL).
            check("nixl_capi_params_add", unsafe {
                sys::nixl_capi_params_add(params.0, ck.as_ptr(), cv.as_ptr())
            })?;
        }
        let cplugin = cstring("nixl_capi_create_backend", plugin)?;
        let mut raw = ptr::null_mut();
        // SAFETY: live agent and params.
        let status = unsafe {
            sys::nixl_capi_create_backend(self.raw, cplugin.as_ptr(), params.0, &mut raw)
        };
        check("nixl_capi_create_backend", status).map_err(|e| NixlError {
            detail: format!(
                "plugin {plugin} could not be initialised with {:?} (see NIXL's log on stderr for the reason)",
                redacted(overrides)
            ),
            ..e
        })?;
        let mut opt = ptr::null_mut();
        // SAFETY: `opt` receives an owned opt-args handle.
        let status = unsafe { sys::nixl_capi_create_opt_args(&mut opt) };
        let backend = Backend {
            agent: Arc::clone(self),
            raw,
            opt,
            plugin: plugin.to_string(),
            abandoned: AtomicUsize::new(0),
            abandon_limit: AtomicUsize::new(DEFAULT_ABANDON_LIMIT),
            ios,
        };
        check("nixl_capi_create_opt_args", status)?;
        // SAFETY: both handles live.
        check("nixl_capi_opt_args_add_backend", unsafe {
            sys::nixl_capi_opt_args_add_backend(backend.opt, backend.raw)
        })?;
        exit::watch(exit::Made::Backend);
        Ok(Arc::new(backend))
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // Not once the process exits: its statics are gone, and so is the process soon.
        let Some(_call) = exit::enter() else { return };
        // SAFETY: every Backend, Registration and Transfer holds an Arc to this agent, so none
        // is alive here.
        unsafe { sys::nixl_capi_destroy_agent(self.raw) };
    }
}

/// A backend (plugin instance) and the opt-args that direct calls to it.
pub struct Backend {
    agent: Arc<Agent>,
    raw: sys::backend_t,
    opt: sys::opt_args_t,
    plugin: String,
    /// Bytes of the backend's own memory held for good by transfers that never settled.
    abandoned: AtomicUsize,
    /// Past this many abandoned bytes, new transfers are refused.
    abandon_limit: AtomicUsize,
    /// The plugin's pool of I/O requests, where it has one (POSIX).
    ios: Option<Arc<IoPool>>,
}

// SAFETY: the handles are only used through the thread-synchronised agent.
unsafe impl Send for Backend {}
// SAFETY: as above.
unsafe impl Sync for Backend {}

impl Drop for Backend {
    fn drop(&mut self) {
        let Some(_call) = exit::enter() else { return };
        // SAFETY: owned handles; destroying the backend handle frees only kvtier's wrapper, the
        // engine itself lives until the agent is destroyed.
        unsafe {
            if !self.opt.is_null() {
                sys::nixl_capi_destroy_opt_args(self.opt);
            }
            sys::nixl_capi_destroy_backend(self.raw);
        }
    }
}

/// Bytes a backend's transfers may leave behind for good before it refuses new ones.
pub const DEFAULT_ABANDON_LIMIT: usize = 1 << 30;

impl Backend {
    /// The plugin's name.
    pub fn plugin(&self) -> &str {
        &self.plugin
    }

    /// Sets how many bytes transfers that never settled (see [`Finished::Unsettled`]) may hold
    /// for good before this backend refuses new transfers: a storage outage then costs
    /// errors, not unbounded memory.
    pub fn limit_abandoned(&self, bytes: usize) {
        self.abandon_limit.store(bytes, Relaxed);
    }

    /// Bytes held for good by transfers that never settled.
    pub fn abandoned_bytes(&self) -> usize {
        self.abandoned.load(Relaxed)
    }

    /// Room for `n` descriptors in flight, waiting up to `wait` for other transfers to give
    /// theirs back (nothing to take where the plugin has no pool). Transfers posted with it
    /// take theirs from it (see [`Backend::post`]); a caller holding transfers it has not
    /// settled should not wait for room only they give back.
    pub fn io_room(&self, n: usize, wait: std::time::Duration) -> Result<IoRoom, NixlError> {
        match &self.ios {
            Some(pool) => pool.take(n, wait),
            None => Ok(IoRoom::default()),
        }
    }

    /// The size of the plugin's pool of I/O requests, where it has one.
    #[cfg(test)]
    pub fn io_pool_size(&self) -> Option<usize> {
        self.ios.as_ref().map(|pool| pool.size())
    }

    /// The most descriptors one posting should take: a quarter of the plugin's pool of I/O
    /// requests, so that a few callers at once each find room (unbounded without a pool).
    pub fn descs_per_posting(&self) -> usize {
        self.ios
            .as_ref()
            .map_or(usize::MAX, |pool| (pool.size() / 4).max(1))
    }

    /// Registers descriptors of one kind with this backend. They are deregistered when the
    /// returned [`Registration`] drops.
    pub fn register(
        self: &Arc<Self>,
        kind: MemKind,
        descs: &[Desc<'_>],
    ) -> Result<Registration, NixlError> {
        let _call = exit::enter_or("nixl_capi_register_mem")?;
        let list = RegList::new(kind, descs)?;
        // SAFETY: live agent, list and opt-args.
        let status = unsafe { sys::nixl_capi_register_mem(self.agent.raw, list.0, self.opt) };
        check("nixl_capi_register_mem", status)?;
        LIVE_REGISTRATIONS.fetch_add(1, Relaxed);
        let (dram, devices) = match kind {
            MemKind::Dram => (descs.iter().map(|d| (d.addr, d.len)).collect(), Vec::new()),
            MemKind::File | MemKind::Object => {
                (Vec::new(), descs.iter().map(|d| d.dev_id).collect())
            }
        };
        Ok(Registration {
            backend: Arc::clone(self),
            list,
            dram,
            devices,
        })
    }

    /// Registers host memory ranges (each distinct range once) for transfers.
    pub fn register_dram(
        self: &Arc<Self>,
        ranges: &[(usize, usize)],
    ) -> Result<Registration, NixlError> {
        let mut unique: Vec<(usize, usize)> = ranges.to_vec();
        unique.sort_unstable();
        unique.dedup();
        let descs: Vec<Desc<'_>> = unique
            .iter()
            .map(|&(addr, len)| Desc::dram(addr, len))
            .collect();
        self.register(MemKind::Dram, &descs)
    }

    /// Which of `descs` the backend reports as present (NIXL queryMem).
    pub fn query(&self, kind: MemKind, descs: &[Desc<'_>]) -> Result<Vec<bool>, NixlError> {
        let _call = exit::enter_or("nixl_capi_query_mem")?;
        let list = RegList::new(kind, descs)?;
        let mut resp = ptr::null_mut();
        // SAFETY: `resp` receives an owned list destroyed by the guard.
        check("nixl_capi_create_query_resp_list", unsafe {
            sys::nixl_capi_create_query_resp_list(&mut resp)
        })?;
        let resp = QueryResp(resp);
        // SAFETY: live agent, list, response list and opt-args.
        check("nixl_capi_query_mem", unsafe {
            sys::nixl_capi_query_mem(self.agent.raw, list.0, resp.0, self.opt)
        })?;
        let mut n = 0usize;
        // SAFETY: live list.
        check("nixl_capi_query_resp_list_size", unsafe {
            sys::nixl_capi_query_resp_list_size(resp.0, &mut n)
        })?;
        (0..n)
            .map(|i| {
                let mut has = false;
                // SAFETY: i < size.
                check("nixl_capi_query_resp_list_has_value", unsafe {
                    sys::nixl_capi_query_resp_list_has_value(resp.0, i, &mut has)
                })
                .map(|()| has)
            })
            .collect()
    }
}

/// Registered descriptors; deregistered on drop.
pub struct Registration {
    backend: Arc<Backend>,
    list: RegList,
    /// The host memory ranges it registered (DRAM).
    dram: Vec<(usize, usize)>,
    /// The device ids it registered (files, objects).
    devices: Vec<u64>,
}

// SAFETY: used only through the thread-synchronised agent.
unsafe impl Send for Registration {}
// SAFETY: no `&self` method calls NIXL; only the owner's drop does.
unsafe impl Sync for Registration {}

impl Drop for Registration {
    fn drop(&mut self) {
        LIVE_REGISTRATIONS.fetch_sub(1, Relaxed);
        let Some(_call) = exit::enter() else { return };
        // SAFETY: live agent, list and opt-args. A failure leaves nothing kvtier can do; NIXL
        // logs it, and path-mode files are closed with the agent at the latest.
        let status = unsafe {
            sys::nixl_capi_deregister_mem(self.backend.agent.raw, self.list.0, self.backend.opt)
        };
        if status != sys::SUCCESS {
            tracing::warn!(status, plugin = %self.backend.plugin, "NIXL deregistration failed");
        }
    }
}

/// Backend parameters as errors may show them: the value of every key that names a secret,
/// token, password or session is `***`.
fn redacted(params: &BTreeMap<String, String>) -> BTreeMap<&str, &str> {
    params
        .iter()
        .map(|(k, v)| {
            let lower = k.to_ascii_lowercase();
            let secret = ["secret", "token", "password", "session", "credential"]
                .iter()
                .any(|s| lower.contains(s));
            (k.as_str(), if secret { "***" } else { v.as_str() })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_parameters_in_errors_hide_secrets() {
        let params: BTreeMap<String, String> = [
            ("bucket", "b"),
            ("access_key", "AKIA-id"),
            ("secret_key", "hunter2"),
            ("session_token", "tok"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let shown = format!("{:?}", redacted(&params));
        assert!(
            !shown.contains("hunter2") && !shown.contains("tok\""),
            "{shown}"
        );
        assert!(
            shown.contains("AKIA-id") && shown.contains("\"b\""),
            "{shown}"
        );
    }
}
