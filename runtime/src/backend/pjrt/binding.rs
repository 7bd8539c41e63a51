//! A small safe binding over the PJRT C API (the `pjrt` crate cannot create a client on current
//! plugins; ../shared/docs/toolchain.md). Every argument struct is zeroed with its `struct_size` set,
//! so one binary works with plugins of newer minor API versions too.

use super::sys;
use crate::error::{Result, RuntimeError};
use g4c_ir::DType;
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::Arc;

/// `CompileOptionsProto` with one replica and one partition. Empty options abort the plugin.
pub const COMPILE_OPTIONS: [u8; 6] = [0x1a, 0x04, 0x20, 0x01, 0x28, 0x01];

fn pjrt_error(message: impl Into<String>) -> RuntimeError {
    RuntimeError::Pjrt(message.into())
}

/// A zeroed argument struct with `struct_size` set.
macro_rules! args {
    ($ty:ident { $($field:ident : $value:expr),* $(,)? }) => {
        sys::$ty { struct_size: std::mem::size_of::<sys::$ty>(), $($field: $value,)* ..Default::default() }
    };
}

/// Calls `PJRT_Api.$f(&mut args)` and turns a returned `PJRT_Error` into `RuntimeError::Pjrt`.
macro_rules! call {
    ($api:expr, $f:ident, $args:expr) => {{
        let api: &Api = &$api;
        match api.table().$f {
            None => Err(pjrt_error(concat!("the plugin does not implement ", stringify!($f)))),
            // SAFETY: `args` is a properly initialised argument struct of the matching type.
            Some(f) => api.check(unsafe { f($args) }, stringify!($f)),
        }
    }};
}

/// A loaded plugin. Kept alive (behind `Arc`) by every object created through it.
pub struct Api {
    table: *const sys::PJRT_Api,
    pub path: PathBuf,
    /// Never unloaded: plugins register exit handlers (deserializing an executable does), which
    /// would jump into unmapped code at process exit after a `dlclose`.
    _library: std::mem::ManuallyDrop<libloading::Library>,
}

// SAFETY: the PJRT C API is thread-safe by contract.
unsafe impl Send for Api {}
unsafe impl Sync for Api {}

impl Api {
    /// Loads a plugin shared object and initialises it.
    pub fn load(path: &Path) -> Result<Arc<Api>> {
        let fail = |m: String| pjrt_error(format!("plugin {}: {m}", path.display()));
        // A bare file name would make dlopen search the library path instead of opening the file here.
        let file = if path.components().count() == 1 { Path::new(".").join(path) } else { path.to_path_buf() };
        // SAFETY: loading a PJRT plugin runs its initialisers, which is what using it requires.
        let library = unsafe { libloading::Library::new(&file) }.map_err(|e| fail(format!("cannot load: {e}")))?;
        let table = unsafe {
            let get: libloading::Symbol<unsafe extern "C" fn() -> *const sys::PJRT_Api> =
                library.get(b"GetPjrtApi\0").map_err(|_| fail("no `GetPjrtApi` symbol: not a PJRT plugin".into()))?;
            get()
        };
        if table.is_null() {
            return Err(fail("GetPjrtApi returned null".into()));
        }
        let api = Api { table, path: path.to_path_buf(), _library: std::mem::ManuallyDrop::new(library) };
        let version = api.table().pjrt_api_version;
        if version.major_version as u32 != sys::PJRT_API_MAJOR || (version.minor_version as u32) < sys::PJRT_API_MINOR {
            return Err(fail(format!(
                "PJRT C API {}.{}, g4c needs {}.{} or a newer minor version",
                version.major_version,
                version.minor_version,
                sys::PJRT_API_MAJOR,
                sys::PJRT_API_MINOR
            )));
        }
        let mut init = args!(PJRT_Plugin_Initialize_Args {});
        call!(api, PJRT_Plugin_Initialize, &mut init)?;
        Ok(Arc::new(api))
    }

    /// The plugin's PJRT C API version (major, minor): part of what an executable cache key covers.
    pub fn version(&self) -> (i32, i32) {
        let v = self.table().pjrt_api_version;
        (v.major_version, v.minor_version)
    }

    fn table(&self) -> &sys::PJRT_Api {
        // SAFETY: checked non-null at load; the table lives as long as the library.
        unsafe { &*self.table }
    }

    fn check(&self, err: *mut sys::PJRT_Error, what: &str) -> Result<()> {
        if err.is_null() {
            return Ok(());
        }
        let mut msg = args!(PJRT_Error_Message_Args { error: err });
        let text = match self.table().PJRT_Error_Message {
            Some(f) => unsafe {
                f(&mut msg);
                let bytes = std::slice::from_raw_parts(msg.message as *const u8, msg.message_size);
                String::from_utf8_lossy(bytes).into_owned()
            },
            None => "unknown error".into(),
        };
        if let Some(f) = self.table().PJRT_Error_Destroy {
            let mut d = args!(PJRT_Error_Destroy_Args { error: err });
            unsafe { f(&mut d) };
        }
        Err(pjrt_error(format!("{what}: {}", text.trim())))
    }

    fn await_event(&self, event: *mut sys::PJRT_Event) -> Result<()> {
        if event.is_null() {
            return Ok(());
        }
        let mut a = args!(PJRT_Event_Await_Args { event: event });
        let result = call!(self, PJRT_Event_Await, &mut a);
        let mut d = args!(PJRT_Event_Destroy_Args { event: event });
        let _ = call!(self, PJRT_Event_Destroy, &mut d);
        result
    }
}

/// A PJRT client on the plugin's first addressable device.
pub struct Client {
    api: Arc<Api>,
    raw: *mut sys::PJRT_Client,
    device: *mut sys::PJRT_Device,
}

unsafe impl Send for Client {}

impl Client {
    pub fn new(api: Arc<Api>) -> Result<Client> {
        let mut create = args!(PJRT_Client_Create_Args {});
        call!(api, PJRT_Client_Create, &mut create)?;
        let raw = create.client;
        let mut devices = args!(PJRT_Client_AddressableDevices_Args { client: raw });
        call!(api, PJRT_Client_AddressableDevices, &mut devices)?;
        if devices.num_addressable_devices == 0 {
            return Err(pjrt_error("the plugin's client has no addressable device"));
        }
        let device = unsafe { *devices.addressable_devices };
        Ok(Client { api, raw, device })
    }

    /// Compiles an MLIR (StableHLO) module, given as text or bytecode.
    pub fn compile(&self, mlir: &[u8]) -> Result<Executable> {
        let format = b"mlir";
        let program = args!(PJRT_Program {
            code: mlir.as_ptr() as *mut _,
            code_size: mlir.len(),
            format: format.as_ptr() as *const _,
            format_size: format.len(),
        });
        let mut a = args!(PJRT_Client_Compile_Args {
            client: self.raw,
            program: &program,
            compile_options: COMPILE_OPTIONS.as_ptr() as *const _,
            compile_options_size: COMPILE_OPTIONS.len(),
        });
        call!(self.api, PJRT_Client_Compile, &mut a)?;
        Executable::wrap(self.api.clone(), a.executable)
    }

    pub fn api(&self) -> &Arc<Api> {
        &self.api
    }

    /// The platform the plugin runs on, as the plugin names it (`cpu`, `tpu`, `cuda`, …).
    pub fn platform_name(&self) -> Result<String> {
        let mut a = args!(PJRT_Client_PlatformName_Args { client: self.raw });
        call!(self.api, PJRT_Client_PlatformName, &mut a)?;
        // SAFETY: the plugin returns a pointer and length valid as long as the client.
        let bytes = unsafe { std::slice::from_raw_parts(a.platform_name as *const u8, a.platform_name_size) };
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    /// Loads an executable that `Executable::serialize` produced. Only safe to call with bytes from the
    /// same plugin build on the same kind of host: another build's bytes may load and compute garbage
    /// (toolchain.md), which is why the executable cache keys entries by the plugin's hash.
    pub fn deserialize(&self, bytes: &[u8]) -> Result<Executable> {
        let mut a = args!(PJRT_Executable_DeserializeAndLoad_Args {
            client: self.raw,
            serialized_executable: bytes.as_ptr() as *const _,
            serialized_executable_size: bytes.len(),
        });
        call!(self.api, PJRT_Executable_DeserializeAndLoad, &mut a)?;
        Executable::wrap(self.api.clone(), a.loaded_executable)
    }

    /// Copies host bytes (little-endian, row-major; `i4` packed two to a byte, low nibble first) into
    /// a device buffer.
    pub fn buffer(&self, dtype: DType, dims: &[usize], bytes: &[u8]) -> Result<Buffer> {
        let ty = g4c_ir::TensorType::new(dtype, dims.to_vec());
        if bytes.len() as u64 != ty.byte_size() {
            return Err(pjrt_error(format!(
                "host buffer of {} bytes for {ty} (needs {})",
                bytes.len(),
                ty.byte_size()
            )));
        }
        // PJRT takes host data of sub-byte types one element per byte (it packs them itself).
        let unpacked: Vec<u8>;
        let bytes = match dtype {
            DType::I4 => {
                unpacked = bytes.iter().flat_map(|&b| [b & 0xF, b >> 4]).take(ty.numel()).collect();
                &unpacked[..]
            }
            _ => bytes,
        };
        let dims: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        let mut a = args!(PJRT_Client_BufferFromHostBuffer_Args {
            client: self.raw,
            data: bytes.as_ptr() as *const c_void,
            type_: buffer_type(dtype)?,
            dims: dims.as_ptr(),
            num_dims: dims.len(),
            host_buffer_semantics: sys::PJRT_HostBufferSemantics::PJRT_HostBufferSemantics_kImmutableOnlyDuringCall,
            device: self.device,
        });
        call!(self.api, PJRT_Client_BufferFromHostBuffer, &mut a)?;
        let buffer = Buffer { api: self.api.clone(), raw: a.buffer };
        self.api.await_event(a.done_with_host_buffer)?;
        Ok(buffer)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let mut a = args!(PJRT_Client_Destroy_Args { client: self.raw });
        let _ = call!(self.api, PJRT_Client_Destroy, &mut a);
    }
}

pub struct Executable {
    api: Arc<Api>,
    raw: *mut sys::PJRT_LoadedExecutable,
    num_outputs: usize,
}

unsafe impl Send for Executable {}

impl Executable {
    fn wrap(api: Arc<Api>, raw: *mut sys::PJRT_LoadedExecutable) -> Result<Executable> {
        let mut get = args!(PJRT_LoadedExecutable_GetExecutable_Args { loaded_executable: raw });
        call!(api, PJRT_LoadedExecutable_GetExecutable, &mut get)?;
        let mut n = args!(PJRT_Executable_NumOutputs_Args { executable: get.executable });
        let counted = call!(api, PJRT_Executable_NumOutputs, &mut n);
        let mut d = args!(PJRT_Executable_Destroy_Args { executable: get.executable });
        let _ = call!(api, PJRT_Executable_Destroy, &mut d);
        counted?;
        Ok(Executable { api, raw, num_outputs: n.num_outputs })
    }

    /// The compiled program as bytes that `Client::deserialize` loads again.
    pub fn serialize(&self) -> Result<Vec<u8>> {
        let mut get = args!(PJRT_LoadedExecutable_GetExecutable_Args { loaded_executable: self.raw });
        call!(self.api, PJRT_LoadedExecutable_GetExecutable, &mut get)?;
        let mut a = args!(PJRT_Executable_Serialize_Args { executable: get.executable });
        let result = call!(self.api, PJRT_Executable_Serialize, &mut a).map(|()| {
            // SAFETY: the bytes stay valid until the deleter runs, just below.
            let bytes = unsafe { std::slice::from_raw_parts(a.serialized_bytes as *const u8, a.serialized_bytes_size) };
            bytes.to_vec()
        });
        if let (Some(delete), false) = (a.serialized_executable_deleter, a.serialized_executable.is_null()) {
            unsafe { delete(a.serialized_executable) };
        }
        let mut d = args!(PJRT_Executable_Destroy_Args { executable: get.executable });
        let _ = call!(self.api, PJRT_Executable_Destroy, &mut d);
        result
    }

    /// Runs on the client's device. Inputs the program donates (`tf.aliasing_output`) are invalid
    /// afterwards: callers drop them (destroying a donated buffer is allowed).
    pub fn execute(&self, inputs: &[&Buffer]) -> Result<Vec<Buffer>> {
        let raw_inputs: Vec<*mut sys::PJRT_Buffer> = inputs.iter().map(|b| b.raw).collect();
        let arg_lists: [*const *mut sys::PJRT_Buffer; 1] = [raw_inputs.as_ptr()];
        let mut outputs: Vec<*mut sys::PJRT_Buffer> = vec![ptr::null_mut(); self.num_outputs];
        let output_lists: [*mut *mut sys::PJRT_Buffer; 1] = [outputs.as_mut_ptr()];
        let mut done: [*mut sys::PJRT_Event; 1] = [ptr::null_mut()];
        let mut options = args!(PJRT_ExecuteOptions {});
        let mut a = args!(PJRT_LoadedExecutable_Execute_Args {
            executable: self.raw,
            options: &mut options,
            argument_lists: arg_lists.as_ptr(),
            num_devices: 1,
            num_args: raw_inputs.len(),
            output_lists: output_lists.as_ptr(),
            device_complete_events: done.as_mut_ptr(),
        });
        call!(self.api, PJRT_LoadedExecutable_Execute, &mut a)?;
        let outputs: Vec<Buffer> = outputs.into_iter().map(|raw| Buffer { api: self.api.clone(), raw }).collect();
        self.api.await_event(done[0])?;
        Ok(outputs)
    }
}

impl Drop for Executable {
    fn drop(&mut self) {
        let mut a = args!(PJRT_LoadedExecutable_Destroy_Args { executable: self.raw });
        let _ = call!(self.api, PJRT_LoadedExecutable_Destroy, &mut a);
    }
}

/// A device buffer.
pub struct Buffer {
    api: Arc<Api>,
    raw: *mut sys::PJRT_Buffer,
}

unsafe impl Send for Buffer {}

impl Buffer {
    /// Copies the buffer to the host as little-endian, row-major bytes.
    pub fn to_host(&self) -> Result<Vec<u8>> {
        let mut size = args!(PJRT_Buffer_ToHostBuffer_Args { src: self.raw });
        call!(self.api, PJRT_Buffer_ToHostBuffer, &mut size)?;
        let mut out = vec![0u8; size.dst_size];
        let mut a = args!(PJRT_Buffer_ToHostBuffer_Args {
            src: self.raw,
            dst: out.as_mut_ptr() as *mut c_void,
            dst_size: out.len(),
        });
        call!(self.api, PJRT_Buffer_ToHostBuffer, &mut a)?;
        self.api.await_event(a.event)?;
        Ok(out)
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let mut a = args!(PJRT_Buffer_Destroy_Args { buffer: self.raw });
        let _ = call!(self.api, PJRT_Buffer_Destroy, &mut a);
    }
}

fn buffer_type(dtype: DType) -> Result<sys::PJRT_Buffer_Type> {
    use sys::PJRT_Buffer_Type as T;
    Ok(match dtype {
        DType::F32 => T::PJRT_Buffer_Type_F32,
        DType::BF16 => T::PJRT_Buffer_Type_BF16,
        DType::F16 => T::PJRT_Buffer_Type_F16,
        DType::I32 => T::PJRT_Buffer_Type_S32,
        DType::I8 => T::PJRT_Buffer_Type_S8,
        DType::Bool => T::PJRT_Buffer_Type_PRED,
        DType::I4 => T::PJRT_Buffer_Type_S4,
    })
}

/// Where to find the PJRT CPU plugin: `G4C_PJRT_PLUGIN`, else the one `scripts/setup` installed into
/// a `.venv` in the current directory or above the running executable (a checkout's `target/…`).
pub fn find_cpu_plugin() -> Option<PathBuf> {
    if let Some(p) = g4c_util::env::path_var("G4C_PJRT_PLUGIN") {
        return Some(p);
    }
    g4c_util::env::venv_file("xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so")
}
