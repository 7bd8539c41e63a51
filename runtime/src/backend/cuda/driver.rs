//! A CUDA GPU through the driver API (cudarc): modules loaded from the program's cubin when it was
//! built for this GPU's SM, else JIT-compiled by the driver from its PTX; buffers from
//! `cuMemAlloc`; every copy and launch on one stream of its own. A launch sequence is captured once
//! into a CUDA graph and replayed, one `cuGraphLaunch` for a call's hundreds of kernels: launched
//! one by one, E2B's 797 decode launches would cost more host time than an H200 takes to run them.

use super::device::{Buffer, Device, DeviceProgram, Launch, LaunchSequence};
use super::staging::PinnedStaging;
use crate::error::{invalid, Result, RuntimeError};
use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaFunction, CudaGraph, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

/// Why no CUDA device can be used here, if none can: cudarc panics without a driver, so this is
/// asked first.
pub fn cuda_driver_problem() -> Option<String> {
    // SAFETY: only probes whether libcuda can be opened.
    if !unsafe { sys::is_culib_present() } {
        return Some("no CUDA driver on this machine (libcuda.so.1 was not found)".into());
    }
    if let Err(e) = result::init() {
        return Some(format!("the CUDA driver failed to start: {e:?}"));
    }
    match CudaContext::device_count() {
        Ok(0) => Some("the CUDA driver sees no GPU".into()),
        Ok(_) => None,
        Err(e) => Some(format!("the CUDA driver cannot count GPUs: {e:?}")),
    }
}

/// GPU 0's peak memory bandwidth in bytes per second, from its memory clock and bus width (two
/// transfers per clock, as NVIDIA's bandwidth figures count them), when a driver and a GPU are
/// there and report both.
pub fn cuda_memory_bandwidth() -> Option<f64> {
    let context = gpu_zero()?;
    let attribute = |a| context.attribute(a).ok().filter(|&v| v > 0);
    let clock_khz = attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)?;
    let bus_bits = attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)?;
    Some(2.0 * clock_khz as f64 * 1e3 * bus_bits as f64 / 8.0)
}

/// The compute capability of GPU 0, when a driver and a GPU are there.
pub fn cuda_device_capability() -> Option<(u32, u32)> {
    let cc = gpu_zero()?.compute_capability().ok()?;
    Some((cc.0 as u32, cc.1 as u32))
}

/// A context on GPU 0, when a driver and a GPU are there (cudarc's `CudaContext::new` panics
/// without a driver: asked first).
fn gpu_zero() -> Option<Arc<CudaContext>> {
    if cuda_driver_problem().is_some() {
        return None;
    }
    CudaContext::new(0).ok()
}

/// Whether a driver of version `driver` (`cuDriverGetVersion`: 12090 for 12.9) can JIT PTX ISA
/// `isa`: the CUDA release that introduced each ISA, from the PTX ISA document's release history.
/// An ISA not in the table is refused.
pub fn ptx_isa_supported(isa: (u32, u32), driver: i32) -> bool {
    let introduced = match isa {
        (7, 0) => 11000,
        (7, 1) => 11010,
        (7, 2) => 11020,
        (7, 3) => 11030,
        (7, 4) => 11040,
        (7, 5) => 11050,
        (7, 6) => 11060,
        (7, 7) => 11070,
        (7, 8) => 11080,
        (8, 0) => 12000,
        (8, 1) => 12010,
        (8, 2) => 12020,
        (8, 3) => 12030,
        (8, 4) => 12040,
        (8, 5) => 12050,
        (8, 6) => 12070,
        (8, 7) => 12080,
        (8, 8) => 12090,
        (9, 0) => 13000,
        (9, 1) => 13010,
        _ => return false,
    };
    driver >= introduced
}

pub struct CudaDevice {
    /// Bound to whichever thread calls, and held so it outlives the modules, stream and buffers.
    context: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    modules: HashMap<String, Arc<CudaModule>>,
    functions: HashMap<(String, String), CudaFunction>,
    buffers: Vec<(sys::CUdeviceptr, usize)>,
    /// Per program, the graph of its current launch sequence (by the sequence's id).
    graphs: HashMap<String, (u64, Graph)>,
    /// Set by `G4C_CUDA_PROFILE`: kernels are launched and timed one by one instead.
    profile: Option<Profile>,
    /// `G4C_CUDA_PDL`: kernels launched with programmatic dependent launch (sm_90), each
    /// scheduled while the one before it runs and waiting for it inside (`await_previous_kernel`).
    programmatic: bool,
    /// What queued uploads (`upload_queued`) copy from, until the stream is next waited for.
    staging: PinnedStaging,
}

/// What `G4C_CUDA_PROFILE` collects: each kernel's launches and GPU time, printed to stderr when
/// the device is dropped. A run's launches are queued one after another with an event after each,
/// so that the time between two events is the kernel's (and the GPU's gap before it), not the
/// host's time to launch it. The first run of each sequence is not timed: it names every launch on
/// stderr and waits for it, so that a kernel that never returns or faults is named by the last line.
struct Profile {
    /// Per entry point, kernel symbol and grid: the launches' time. The entry and grid tell apart
    /// launches of one symbol (a prefill's and a decode step's), and with the symbol find the
    /// launch in `g4c compile --json`'s report, whose calls name the plan's kernels.
    kernels: BTreeMap<(String, String, u32), KernelTime>,
    traced: HashSet<u64>,
    /// One more than the most launches a sequence has had.
    events: Vec<CudaEvent>,
    opened: Instant,
}

/// A kernel's launches, their milliseconds in all, and the bytes each must move (`Launch::bytes`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct KernelTime {
    launches: u64,
    ms: f64,
    bytes: u64,
}

impl Profile {
    /// One row per kernel, the longest first: its time, share, launches and time per launch, the
    /// bytes a launch must move and the bandwidth that makes (`-` where not counted), entry, grid
    /// and symbol.
    fn report(&self) -> String {
        let total: f64 = self.kernels.values().map(|k| k.ms).sum();
        let mut rows: Vec<_> = self.kernels.iter().collect();
        rows.sort_by(|a, b| b.1.ms.total_cmp(&a.1.ms));
        let mut s = format!(
            "cuda profile: {total:.3} ms of kernels in all (each sequence's first run untimed; bytes: what a launch must \
             read and write, every cache chunk counted)\n    ms   share  launches  µs/launch  MB/launch     GB/s  entry      grid  kernel\n"
        );
        for ((entry, symbol, grid), k) in rows {
            let (mb, rate) = match k.bytes {
                0 => ("-".to_string(), "-".to_string()),
                b => (format!("{:.3}", b as f64 / 1e6), format!("{:.0}", b as f64 * k.launches as f64 / (k.ms * 1e6))),
            };
            s += &format!(
                "{:>9.3}  {:>5.1}%  {:>8}  {:>9.2}  {mb:>9}  {rate:>7}  {entry:<8} {grid:>7}  {symbol}\n",
                k.ms,
                100.0 * k.ms / total.max(f64::MIN_POSITIVE),
                k.launches,
                1e3 * k.ms / k.launches as f64
            );
        }
        s
    }
}

/// A CUDA graph, held and replayed only by the thread that steps the executor.
struct Graph(CudaGraph);

// SAFETY: the graph is created, launched and dropped only through `&mut CudaDevice`, so never from
// two threads at once, which is all the driver asks of graph objects; the context is bound to the
// calling thread before each use.
unsafe impl Send for Graph {}

impl CudaDevice {
    /// Opens GPU 0 and loads every program. Fails with one line when there is no usable driver.
    pub fn new(programs: &[DeviceProgram]) -> Result<CudaDevice> {
        if let Some(problem) = cuda_driver_problem() {
            return invalid(problem);
        }
        let fail = |what: &str, e: cudarc::driver::DriverError| RuntimeError::Invalid(format!("CUDA: {what}: {e:?}"));
        let context = CudaContext::new(0).map_err(|e| fail("opening GPU 0", e))?;
        // SAFETY: no cudarc slice is made here (buffers are raw allocations used on this device's
        // one stream), so cudarc's event tracking has nothing to order. Left on, the first stream
        // made on this context object synchronizes the whole context, which invalidates any graph
        // another thread is capturing on GPU 0's primary context (the GPU test opens a device per
        // thread).
        unsafe { context.disable_event_tracking() };
        let sm = context.compute_capability().map_err(|e| fail("its compute capability", e))?;
        let sm = (sm.0 as u32, sm.1 as u32);
        let mut driver = 0;
        // SAFETY: writes one int.
        unsafe { sys::cuDriverGetVersion(&mut driver) }.result().map_err(|e| fail("the driver's version", e))?;
        // Not the legacy default stream: a stream can only be captured into a graph if it is not that.
        let stream = context.new_stream().map_err(|e| fail("creating a stream", e))?;
        let mut modules = HashMap::new();
        for p in programs {
            modules.insert(p.entry.clone(), load_program(&context, p, sm, driver)?);
        }
        let profile = g4c_util::env::flag_var("G4C_CUDA_PROFILE").then(|| Profile {
            kernels: BTreeMap::new(),
            traced: HashSet::new(),
            events: Vec::new(),
            opened: Instant::now(),
        });
        let programmatic = g4c_util::env::flag_var("G4C_CUDA_PDL");
        if let Some(problem) = programmatic.then(|| programmatic_launch_problem(programs, sm)).flatten() {
            return invalid(problem);
        }
        Ok(CudaDevice {
            staging: PinnedStaging::new(context.clone()),
            context,
            stream,
            modules,
            functions: HashMap::new(),
            buffers: Vec::new(),
            graphs: HashMap::new(),
            programmatic,
            profile,
        })
    }

    /// Makes the context current on the calling thread: the executor may be built on one thread and
    /// stepped on another (`g4c serve`'s engine thread), and the raw driver calls need it current.
    fn bind(&self) -> Result<()> {
        // cudarc keeps the error of a release it could not report (a drop) on the context, and
        // binding returns it: named for what it is, not for the binding.
        self.context.check_err().map_err(|e| driver_error("an earlier release on this device", e))?;
        self.context.bind_to_thread().map_err(|e| driver_error("binding the context to this thread", e))
    }

    fn function(&mut self, program: &str, symbol: &str) -> Result<CudaFunction> {
        let key = (program.to_string(), symbol.to_string());
        if let Some(f) = self.functions.get(&key) {
            return Ok(f.clone());
        }
        let module =
            self.modules.get(program).ok_or_else(|| RuntimeError::Invalid(format!("no program @{program}")))?;
        let f = module.load_function(symbol).map_err(|e| RuntimeError::Invalid(format!("kernel {symbol}: {e:?}")))?;
        self.functions.insert(key, f.clone());
        Ok(f)
    }
}

/// The module of program `p` on a GPU of compute capability `sm` under a driver of version
/// `driver`: its cubin where it was built for `sm`, else its PTX, JIT-compiled by the driver where
/// it knows the PTX's ISA. A cubin the driver refuses (made by a newer ptxas than it knows) gives
/// way to the PTX, saying so.
fn load_program(context: &Arc<CudaContext>, p: &DeviceProgram, sm: (u32, u32), driver: i32) -> Result<Arc<CudaModule>> {
    let fail = |e| driver_error(&format!("loading @{}", p.entry), e);
    if let Some((_, cubin)) = p.cubin.as_ref().filter(|(built, _)| *built == sm) {
        match context.load_module(Ptx::from_binary(cubin.clone())) {
            Ok(module) => return Ok(module),
            Err(e) if p.ptx.is_some() => {
                eprintln!(
                    "g4c: @{}: the driver refused its sm_{}{} cubin ({e:?}); JIT-compiling its PTX",
                    p.entry, sm.0, sm.1
                )
            }
            Err(e) => return Err(fail(e)),
        }
    }
    let Some(ptx) = &p.ptx else {
        return invalid(format!("@{}: neither a cubin for sm_{}{} nor PTX", p.entry, sm.0, sm.1));
    };
    if let Some(needs) = ptx_target(ptx).filter(|&needs| needs > sm) {
        return invalid(format!(
            "@{}: its kernels are for compute capability {}.{} and later, and this GPU's is {}.{}; compile for this GPU's target",
            p.entry, needs.0, needs.1, sm.0, sm.1
        ));
    }
    let isa = ptx_isa_version(ptx);
    if !isa.is_some_and(|isa| ptx_isa_supported(isa, driver)) {
        return invalid(format!(
            "@{}: its PTX is ISA {}, which this driver ({}.{}) cannot JIT-compile, and it has no cubin for sm_{}{} that loads; recompile with an older NVRTC or on a newer driver",
            p.entry,
            isa.map(|(a, b)| format!("{a}.{b}")).unwrap_or_else(|| "?".into()),
            driver / 1000,
            driver % 1000 / 10,
            sm.0,
            sm.1
        ));
    }
    if ptx.contains('\0') {
        // cudarc hands the driver a C string, and panics making one from text with a NUL.
        return invalid(format!("@{}: its PTX holds a NUL byte", p.entry));
    }
    context.load_module(Ptx::from_src(ptx.clone())).map_err(|e| match jit_error_log(context, ptx) {
        Some(log) => RuntimeError::Invalid(format!("CUDA: JIT-compiling @{}'s PTX: {e:?}: {log}", p.entry)),
        None => fail(e),
    })
}

/// The driver's account of why it could not JIT-compile `ptx`, which `cuModuleLoadData` (what
/// cudarc loads with) does not give: the PTX loaded again with an error log, after a failure only.
fn jit_error_log(context: &Arc<CudaContext>, ptx: &str) -> Option<String> {
    context.bind_to_thread().ok()?;
    let source = std::ffi::CString::new(ptx).ok()?;
    let mut log = vec![0u8; 16 * 1024];
    let mut options =
        [sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER, sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES];
    // The size option's value is the number itself, in the place of a pointer.
    let mut values = [log.as_mut_ptr().cast::<std::ffi::c_void>(), log.len() as *mut std::ffi::c_void];
    let mut module: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: `source` is a C string; the log buffer outlives the call and is as long as its size
    // option says; a module that loads after all is unloaded at once.
    unsafe {
        let loaded = sys::cuModuleLoadDataEx(
            &mut module,
            source.as_ptr().cast(),
            options.len() as u32,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
        );
        if loaded == sys::CUresult::CUDA_SUCCESS {
            sys::cuModuleUnload(module);
        }
    }
    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
    let text = String::from_utf8_lossy(&log[..end]);
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).take(4).collect();
    (!lines.is_empty()).then(|| lines.join("; "))
}

/// Why `programs` cannot be launched with programmatic dependent launch on a GPU of compute
/// capability `sm`, if they cannot: it needs sm_90, and every kernel must wait for the one before
/// it (which g4c's kernels do only when compiled for sm_90 or later; a t4g artifact's do not, and
/// launched so they would read what the kernel before them is still writing).
fn programmatic_launch_problem(programs: &[DeviceProgram], sm: (u32, u32)) -> Option<String> {
    if sm < (9, 0) {
        return Some(format!(
            "G4C_CUDA_PDL: programmatic dependent launch needs compute capability 9.0 or later; this GPU's is {}.{}",
            sm.0, sm.1
        ));
    }
    let ready = |p: &&DeviceProgram| {
        let symbols: HashSet<&str> = p.kernels.iter().map(|k| k.symbol.as_str()).collect();
        let (kernels, waiting) = p.ptx.as_deref().map_or((0, 0), ptx_kernels_waiting);
        kernels > 0 && waiting == kernels && kernels == symbols.len()
    };
    let unready = programs.iter().find(|p| !ready(p))?;
    Some(format!(
        "G4C_CUDA_PDL: @{}'s kernels do not wait for the kernel before them (they were compiled for a GPU older than sm_90); unset G4C_CUDA_PDL",
        unready.entry
    ))
}

/// How many kernels (`.entry`) a PTX text defines, and how many of them wait for the kernel before
/// them (`griddepcontrol.wait`, for programmatic dependent launch).
pub fn ptx_kernels_waiting(ptx: &str) -> (usize, usize) {
    let kernels: Vec<&str> = ptx.split(".entry").skip(1).filter(|k| k.starts_with(char::is_whitespace)).collect();
    (kernels.len(), kernels.iter().filter(|k| k.contains("griddepcontrol.wait")).count())
}

/// The compute capability a PTX text is for (`.target sm_90` → `(9, 0)`): no older GPU runs it.
fn ptx_target(ptx: &str) -> Option<(u32, u32)> {
    let line = ptx.lines().find(|l| l.trim_start().starts_with(".target"))?;
    let sm = line.split_whitespace().nth(1)?.trim_end_matches(',').strip_prefix("sm_")?;
    let digits: String = sm.chars().take_while(char::is_ascii_digit).collect();
    let (major, minor) = digits.split_at(digits.len().checked_sub(1)?);
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// The PTX ISA version a PTX text declares (`.version 8.8` → `(8, 8)`): a driver JITs it only if
/// it knows that ISA.
pub fn ptx_isa_version(ptx: &str) -> Option<(u32, u32)> {
    let line = ptx.lines().find(|l| l.trim_start().starts_with(".version"))?;
    let (major, minor) = line.split_whitespace().nth(1)?.split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

fn driver_error(what: &str, e: cudarc::driver::DriverError) -> RuntimeError {
    RuntimeError::Invalid(format!("CUDA: {what}: {e:?}"))
}

impl CudaDevice {
    /// Every kernel `sequence` launches, looked up, and opted in to its launch's dynamic shared
    /// memory where it has some.
    fn functions(&mut self, sequence: &LaunchSequence) -> Result<Vec<CudaFunction>> {
        sequence
            .launches
            .iter()
            .map(|l| {
                let f = self.function(&sequence.program, &l.symbol)?;
                if l.dynamic_smem_bytes > 0 {
                    self.opt_in(&f, l)?;
                }
                Ok(f)
            })
            .collect()
    }

    /// Lets `f` be launched with `launch`'s dynamic shared memory: past 48 KiB a block, the driver
    /// refuses a launch unless its function asked for that much first.
    fn opt_in(&self, f: &CudaFunction, launch: &Launch) -> Result<()> {
        let attribute = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        f.set_attribute(attribute, launch.dynamic_smem_bytes as i32).map_err(|e| {
            let most = self.context.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
            RuntimeError::Invalid(format!(
                "kernel {} needs {} bytes of shared memory a block, and this GPU allows {} ({e:?}); compile for this GPU's target",
                launch.symbol,
                launch.dynamic_smem_bytes,
                most.map_or("?".to_string(), |b| b.to_string()),
            ))
        })
    }

    /// Launches (or, while the stream records, records) `f` as `launch` says.
    fn launch(&self, f: &CudaFunction, launch: &Launch) -> Result<()> {
        let mut pointers: Vec<sys::CUdeviceptr> = launch.args.iter().map(|&b| self.buffers[b].0).collect();
        let mut params: Vec<*mut std::ffi::c_void> =
            pointers.iter_mut().map(|p| p as *mut sys::CUdeviceptr as *mut std::ffi::c_void).collect();
        let failed = |e| driver_error(&format!("launching {}", launch.symbol), e);
        if self.programmatic {
            // SAFETY: a zeroed attribute is a valid bit pattern (a C struct of integers); its id
            // and the union member that id reads are set below.
            let mut attribute: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attribute.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attribute.value.programmaticStreamSerializationAllowed = 1;
            let config = sys::CUlaunchConfig {
                gridDimX: launch.grid,
                gridDimY: 1,
                gridDimZ: 1,
                blockDimX: launch.block,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: launch.dynamic_smem_bytes,
                hStream: self.stream.cu_stream(),
                attrs: &mut attribute,
                numAttrs: 1,
            };
            // SAFETY: as below; the configuration and its one attribute outlive the call.
            return unsafe {
                sys::cuLaunchKernelEx(&config, f.cu_function(), params.as_mut_ptr(), std::ptr::null_mut())
            }
            .result()
            .map_err(failed);
        }
        // SAFETY: every parameter of g4c's kernels is a pointer, passed by address as the driver
        // API requires (the values are copied into the launch or graph node); dynamic shared
        // memory beyond 48 KiB was opted in to (`functions`).
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                (launch.grid, 1, 1),
                (launch.block, 1, 1),
                launch.dynamic_smem_bytes,
                self.stream.cu_stream(),
                &mut params,
            )
        }
        .map_err(failed)
    }

    /// Waits for everything queued on the stream (`what` names it in an error): the staging
    /// region's bytes have then been copied.
    fn wait(&mut self, what: &str) -> Result<()> {
        self.stream.synchronize().map_err(|e| driver_error(what, e))?;
        self.staging.reuse();
        Ok(())
    }

    /// Records `sequence`'s launches on the stream into a graph, without running them.
    fn capture(&mut self, sequence: &LaunchSequence) -> Result<Graph> {
        // Look every kernel up first: nothing but launches may happen while the stream records.
        let functions = self.functions(sequence)?;
        let capturing = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        self.stream.begin_capture(capturing).map_err(|e| driver_error("starting a graph capture", e))?;
        let launched = sequence.launches.iter().zip(&functions).try_for_each(|(launch, f)| self.launch(f, launch));
        // The capture is ended whatever happened, so the stream is usable again.
        let ended = self.stream.end_capture(sys::CUgraphInstantiate_flags(0));
        launched?;
        let graph = ended
            .map_err(|e| driver_error(&format!("instantiating @{}'s graph", sequence.program), e))?
            .ok_or_else(|| RuntimeError::Invalid(format!("CUDA: @{}'s graph is empty", sequence.program)))?;
        graph.upload().map_err(|e| driver_error("uploading a graph", e))?;
        Ok(Graph(graph))
    }

    /// Runs `sequence` kernel by kernel, timing and waiting for each (`G4C_CUDA_PROFILE`).
    fn run_profiled(&mut self, sequence: &LaunchSequence) -> Result<()> {
        let functions = self.functions(sequence)?;
        let mut profile = self.profile.take().expect("profiling");
        let ran = self.run_profiled_with(sequence, &functions, &mut profile);
        self.profile = Some(profile);
        ran
    }

    fn run_profiled_with(
        &self,
        sequence: &LaunchSequence,
        functions: &[CudaFunction],
        profile: &mut Profile,
    ) -> Result<()> {
        let event_error = |e| driver_error("recording an event", e);
        let timed = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        while profile.events.len() <= sequence.launches.len() {
            profile.events.push(self.context.new_event(timed).map_err(|e| driver_error("creating an event", e))?);
        }
        let trace = profile.traced.insert(sequence.id);
        profile.events[0].record(&self.stream).map_err(event_error)?;
        for (i, (launch, f)) in sequence.launches.iter().zip(functions).enumerate() {
            if trace {
                let at = profile.opened.elapsed().as_secs_f64();
                eprintln!("cuda profile: {at:.3} s: @{} launch {i}: {}", sequence.program, launch.symbol);
            }
            self.launch(f, launch)?;
            profile.events[i + 1].record(&self.stream).map_err(event_error)?;
            if trace {
                profile.events[i + 1].synchronize().map_err(|e| driver_error(&launch.symbol, e))?;
            }
        }
        if trace {
            return Ok(());
        }
        for (i, launch) in sequence.launches.iter().enumerate() {
            let ms =
                profile.events[i].elapsed_ms(&profile.events[i + 1]).map_err(|e| driver_error(&launch.symbol, e))?;
            let key = (sequence.program.clone(), launch.symbol.clone(), launch.grid);
            let kernel = profile.kernels.entry(key).or_default();
            kernel.launches += 1;
            kernel.ms += f64::from(ms);
            kernel.bytes = launch.bytes;
        }
        Ok(())
    }
}

impl Device for CudaDevice {
    fn alloc(&mut self, bytes: usize) -> Result<Buffer> {
        self.bind()?;
        let bytes = bytes.max(1);
        // SAFETY: the context is current on this thread; the allocation is freed on drop.
        let ptr = unsafe { result::malloc_sync(bytes) }.map_err(|e| driver_error("cuMemAlloc", e))?;
        // SAFETY: `ptr` is a live allocation of `bytes` bytes.
        unsafe { result::memset_d8_async(ptr, 0, bytes, self.stream.cu_stream()) }
            .map_err(|e| driver_error("cuMemsetD8", e))?;
        self.buffers.push((ptr, bytes));
        Ok(self.buffers.len() - 1)
    }

    fn upload_at(&mut self, buffer: Buffer, offset: usize, bytes: &[u8]) -> Result<()> {
        self.bind()?;
        let (ptr, size) = self.buffers[buffer];
        if offset.checked_add(bytes.len()).is_none_or(|end| end > size) {
            return invalid(format!("an upload of {} bytes at {offset} into a buffer of {size}", bytes.len()));
        }
        // SAFETY: within the allocation; `bytes` outlives the copy, which is waited for.
        unsafe { result::memcpy_htod_async(ptr + offset as u64, bytes, self.stream.cu_stream()) }
            .map_err(|e| driver_error("cuMemcpyHtoD", e))?;
        self.wait("an upload")
    }

    fn upload_queued(&mut self, buffer: Buffer, bytes: &[u8]) -> Result<()> {
        self.bind()?;
        let (ptr, size) = self.buffers[buffer];
        if bytes.len() > size {
            return invalid(format!("an upload of {} bytes into a buffer of {size}", bytes.len()));
        }
        if bytes.is_empty() {
            return Ok(());
        }
        if !self.staging.has_room(bytes.len()) {
            // The copies queued from the staging region must be done before it is written again;
            // the wait frees it, so what it held is counted first.
            let wanted = self.staging.staged() + bytes.len();
            self.wait("an upload")?;
            self.staging.grow(wanted).map_err(|e| driver_error("cuMemHostAlloc", e))?;
        }
        let staged = self.staging.stage(bytes);
        // SAFETY: within the allocation; the staged bytes stay as they are until the stream is
        // next waited for, after the copy.
        unsafe { result::memcpy_htod_async(ptr, staged, self.stream.cu_stream()) }
            .map_err(|e| driver_error("cuMemcpyHtoD", e))
    }

    fn download(&mut self, buffer: Buffer, bytes: usize) -> Result<Vec<u8>> {
        self.bind()?;
        let (ptr, size) = self.buffers[buffer];
        let mut out = vec![0u8; bytes.min(size)];
        // SAFETY: within the allocation; `out` outlives the copy, which is waited for.
        unsafe { result::memcpy_dtoh_async(&mut out, ptr, self.stream.cu_stream()) }
            .map_err(|e| driver_error("cuMemcpyDtoH", e))?;
        self.wait("a kernel")?;
        Ok(out)
    }

    fn copy(&mut self, dst: Buffer, src: Buffer, bytes: usize) -> Result<()> {
        self.bind()?;
        let ((d, to), (s, from)) = (self.buffers[dst], self.buffers[src]);
        if bytes > to.min(from) {
            return invalid(format!("a copy of {bytes} bytes from a buffer of {from} into one of {to}"));
        }
        // SAFETY: both allocations hold at least `bytes` bytes (checked); ordered after the
        // launches before it on the same stream.
        unsafe { result::memcpy_dtod_async(d, s, bytes, self.stream.cu_stream()) }
            .map_err(|e| driver_error("cuMemcpyDtoD", e))
    }

    fn run(&mut self, sequence: &LaunchSequence) -> Result<()> {
        if self.profile.is_some() {
            self.bind()?;
            return self.run_profiled(sequence);
        }
        self.prepare(sequence)?;
        let (_, Graph(graph)) = &self.graphs[&sequence.program];
        graph.launch().map_err(|e| driver_error(&format!("launching @{}'s graph", sequence.program), e))
    }

    /// Captures `sequence`'s graph unless its program's current graph is that sequence's. Profiled
    /// runs launch kernel by kernel and record nothing.
    fn prepare(&mut self, sequence: &LaunchSequence) -> Result<()> {
        self.bind()?;
        if self.profile.is_none() && self.graphs.get(&sequence.program).is_none_or(|(id, _)| *id != sequence.id) {
            let graph = self.capture(sequence)?;
            self.graphs.insert(sequence.program.clone(), (sequence.id, graph));
        }
        Ok(())
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        let _ = self.bind();
        let _ = self.stream.synchronize();
        if let Some(profile) = &self.profile {
            eprint!("{}", profile.report());
        }
        self.graphs.clear();
        for &(ptr, _) in &self.buffers {
            // SAFETY: allocated by `alloc`, freed once.
            let _ = unsafe { result::free_sync(ptr) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{programmatic_launch_problem, ptx_isa_supported, ptx_target, DeviceProgram, KernelTime, Profile};
    use crate::backend::cuda::KernelBinding;

    #[test]
    fn the_profile_names_each_launch_by_entry_symbol_and_grid() {
        let key = |entry: &str, grid| (entry.to_string(), "g4c_dot_0123".to_string(), grid);
        let profile = Profile {
            kernels: [
                (key("prefill", 524288), KernelTime { launches: 3, ms: 3.0, bytes: 0 }),
                (key("decode", 64), KernelTime { launches: 100, ms: 1.0, bytes: 2_000_000 }),
            ]
            .into_iter()
            .collect(),
            traced: Default::default(),
            events: vec![],
            opened: std::time::Instant::now(),
        };
        let report = profile.report();
        let lines: Vec<&str> = report.lines().collect();
        assert!(lines[0].contains("4.000 ms of kernels"), "{report}");
        let columns = |line: &str| line.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        assert_eq!(
            columns(lines[2]),
            ["3.000", "75.0%", "3", "1000.00", "-", "-", "prefill", "524288", "g4c_dot_0123"]
        );
        // 100 launches of 2 MB in 1 ms: 200 GB/s.
        let decode = ["1.000", "25.0%", "100", "10.00", "2.000", "200", "decode", "64", "g4c_dot_0123"];
        assert_eq!(columns(lines[3]), decode);
    }

    #[test]
    fn ptx_names_the_compute_capability_it_is_for() {
        assert_eq!(ptx_target(".version 8.8\n.target sm_90\n.address_size 64\n"), Some((9, 0)));
        assert_eq!(ptx_target(".target sm_75, debug\n"), Some((7, 5)));
        assert_eq!(ptx_target(".target sm_90a\n"), Some((9, 0)));
        assert_eq!(ptx_target(".target sm_100\n"), Some((10, 0)));
        assert_eq!(ptx_target(".version 8.8\n"), None);
    }

    #[test]
    fn ptx_isa_needs_the_cuda_release_that_introduced_it() {
        assert!(ptx_isa_supported((7, 0), 11000) && !ptx_isa_supported((7, 0), 10020));
        assert!(ptx_isa_supported((7, 7), 11070) && !ptx_isa_supported((7, 7), 11060));
        assert!(ptx_isa_supported((8, 8), 12090));
        assert!(!ptx_isa_supported((8, 8), 12080));
        assert!(ptx_isa_supported((8, 6), 12070) && !ptx_isa_supported((8, 6), 12060));
        assert!(ptx_isa_supported((8, 4), 12040));
        assert!(ptx_isa_supported((9, 0), 13000) && !ptx_isa_supported((9, 0), 12090));
        assert!(!ptx_isa_supported((9, 9), i32::MAX), "an ISA not in the table is refused");
    }

    #[test]
    fn programmatic_launch_needs_sm_90_and_kernels_that_wait() {
        let program = |ptx: &str| DeviceProgram {
            entry: "decode".into(),
            source: String::new(),
            ptx: Some(ptx.into()),
            cubin: None,
            kernels: ["a", "b", "a"].map(|s| KernelBinding { symbol: s.into(), weights: vec![] }).to_vec(),
        };
        let waiting = program(".entry a(\n griddepcontrol.wait;\n}\n.entry\tb(\n griddepcontrol.wait;\n}");
        assert_eq!(programmatic_launch_problem(std::slice::from_ref(&waiting), (9, 0)), None);
        let refused = programmatic_launch_problem(std::slice::from_ref(&waiting), (8, 0)).unwrap();
        assert!(refused.contains("9.0") && refused.contains("8.0"), "{refused}");
        // A kernel that does not wait, one the PTX lacks, or no kernels found at all.
        for ptx in
            [".entry a(\n griddepcontrol.wait;\n}\n.entry b(\n ret;\n}", ".entry a(\n griddepcontrol.wait;\n}", ""]
        {
            let refused = programmatic_launch_problem(&[waiting.clone(), program(ptx)], (9, 0)).unwrap();
            assert!(refused.contains("@decode") && refused.contains("older than sm_90"), "{refused}");
        }
    }
}
