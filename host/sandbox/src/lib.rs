//! sandflow-sandbox: wasmtime hosting for flow components.
//!
//! One wasmtime [`Engine`] per [`Sandbox`] (share the sandbox, not one engine
//! per component), a registry of components keyed by the SHA-256 [`Digest`]
//! of their bytes with one `InstancePre` each (sandflow's own engine is one
//! entry like any other), and one [`Store`] per flow with its own memory cap
//! and CPU budget per call. The CPU budget counts epochs, which a thread
//! advances every 5 ms in production ([`Epochs::Ticker`]) and a test advances
//! by hand ([`Epochs::Manual`], [`Sandbox::advance_epoch`]).
//!
//! WASI is reduced to nothing: no files, network, environment or arguments;
//! clocks are frozen at zero and random numbers come from a fixed seed, so a
//! guest cannot observe anything but what the host pushes into it. A
//! component that imports anything beyond the contract and that WASI is
//! refused when it is registered.
//!
//! A trap, a limit hit or a guest error fails only that flow's instance: the
//! [`FlowInstance`] is poisoned and every later call returns the same error.
//! Everything a guest returns is checked with `sandflow_contract` before use.
//!
//! Must not know the engine's internals, SQL or storage.

mod component;
mod convert;
#[cfg(target_os = "linux")]
mod memory;
mod wasi;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use snafu::Snafu;
use wasmtime::component::{Linker, ResourceAny};
use wasmtime::{Config, Engine, Store};

pub use sandflow_contract::{Batch, Column, DataType, Field, FlowError, SourceSchema, TickOutput};
pub use wasi::{GuestLog, LOG_LINES, LOG_LINE_BYTES};

use self::component::bindings::{FlowEngine, FlowEnginePre};
use self::wasi::GuestState;

/// Why a runtime or a flow instance failed.
#[derive(Debug, Snafu, Clone)]
#[snafu(visibility(pub(crate)))]
pub enum RuntimeError {
    /// The engine or the guest component could not be set up.
    #[snafu(display("cannot set up the wasm runtime: {message}"))]
    Setup { message: String },
    /// The guest refused the call with its own error (bad input, unsupported plan, ...).
    #[snafu(display("{error}"))]
    Guest { error: FlowError },
    /// The guest used more CPU in one call than its budget allows.
    #[snafu(display(
        "flow exceeded its CPU budget of {budget:?} per call and was stopped; \
         raise cpu_limit_per_tick or simplify the query"
    ))]
    CpuLimit { budget: Duration },
    /// The guest tried to grow its memory past the cap.
    #[snafu(display(
        "flow exceeded its memory limit of {limit} bytes and was stopped; \
         raise memory_limit or reduce the flow's state (e.g. EXPIRE AFTER)"
    ))]
    MemoryLimit { limit: usize },
    /// The guest trapped (a panic, an out-of-bounds access, ...).
    #[snafu(display("flow guest trapped: {message}"))]
    Trap { message: String },
    /// The guest returned something that breaks the contract.
    #[snafu(display("flow guest broke the contract: {message}"))]
    Contract { message: String },
    /// A previous failure poisoned this instance.
    #[snafu(display("flow instance has failed earlier: {message}"))]
    Poisoned { message: String },
}

/// The SHA-256 of a component's bytes: its name in a [`Sandbox`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        use sha2::Digest as _;
        Digest(sha2::Sha256::digest(bytes).into())
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

/// The contract package (and version) a flow component is built against.
pub const FLOW_PACKAGE: &str = "sandflow:flow@0.3.0";
/// The interface a flow component must export.
pub const FLOW_EXPORT: &str = "sandflow:flow/engine@0.3.0";

/// The interface families a flow component may import (any version of each):
/// the contract's types and the WASI a language runtime links for its
/// standard output, clocks and random numbers. The sandbox backs them with a
/// context that has no capabilities: output goes to the flow's log, clocks
/// read 0, random numbers come from a fixed seed. Files (`wasi:filesystem`),
/// sockets (`wasi:sockets`) and anything else are refused by name when a
/// component is registered, even though a preopen-less context would give
/// them nothing: an import the sandbox does not need is surface it does not
/// have to defend.
pub const ALLOWED_IMPORTS: [&str; 5] = [
    "sandflow:flow/types",
    "wasi:io/",
    "wasi:cli/",
    "wasi:clocks/",
    "wasi:random/",
];

/// Whether a component may import the interface named `name` (e.g.
/// `wasi:cli/stdout@0.2.6`).
fn import_allowed(name: &str) -> bool {
    ALLOWED_IMPORTS.iter().any(|prefix| {
        name.strip_prefix(prefix).is_some_and(|rest| {
            // "sandflow:flow/types" must be followed by its version (or
            // nothing); the WASI families by an interface name.
            if prefix.ends_with('/') {
                !rest.is_empty()
            } else {
                rest.is_empty() || rest.starts_with('@')
            }
        })
    })
}
/// The contract's version, as `information_schema.components` shows it.
pub const FLOW_WORLD_VERSION: &str = "0.3.0";

/// Refuses, with a message for a person, bytes that cannot be a component:
/// not WebAssembly at all, or a core module (which has no imports or exports
/// of the contract's types).
fn check_component_header(bytes: &[u8]) -> Result<(), RuntimeError> {
    const MAGIC: &[u8] = b"\0asm";
    let setup = |message: String| Err(RuntimeError::Setup { message });
    if bytes.len() < 8 || &bytes[..4] != MAGIC {
        return setup(format!(
            "the bytes are not a WebAssembly component (they do not start with \\0asm; got {} \
             bytes); build one with `cargo build --target wasm32-wasip2` or wasm-tools component \
             new",
            bytes.len()
        ));
    }
    match bytes[4..8] {
        // Core modules: version 1, layer 0.
        [0x01, 0x00, 0x00, 0x00] => setup(
            "the bytes are a core WebAssembly module, not a component; wrap it with \
             `wasm-tools component new` (or build for wasm32-wasip2) so that it exports \
             sandflow:flow/engine@0.3.0"
                .into(),
        ),
        // Components: layer 1.
        [_, _, 0x01, 0x00] => Ok(()),
        _ => setup(
            "the bytes are a WebAssembly binary of an unknown version or layer, not a \
             component this server can run"
                .into(),
        ),
    }
}

/// What advances the epochs that CPU budgets are counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Epochs {
    /// A thread, every 5 ms: budgets are wall-clock time.
    #[default]
    Ticker,
    /// Only [`Sandbox::advance_epoch`]: budgets are counted in calls a test
    /// makes, independent of the machine's speed.
    Manual,
}

/// Settings of a sandbox.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Where compiled components are cached; `None` compiles in memory each start.
    pub cache_dir: Option<PathBuf>,
    /// What advances the epochs of CPU budgets.
    pub epochs: Epochs,
    /// How instances get their memory: on demand (the default: any number,
    /// each mapping what it uses), or from a pool of this many slots set up
    /// once (faster to instantiate; for benchmarks).
    pub pool: Option<u32>,
    /// The largest memory limit any flow may ask for.
    pub max_memory_limit: usize,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            cache_dir: None,
            epochs: Epochs::Ticker,
            pool: None,
            max_memory_limit: 4 << 30,
        }
    }
}

/// Limits of one flow instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowLimits {
    /// Linear memory cap in bytes.
    pub memory: usize,
    /// Wall-clock CPU budget of one call into the guest.
    pub cpu_per_call: Duration,
    /// Largest number of rows one call to `tick` may return (the guest
    /// returns the rest on the next call).
    pub max_output_rows: u32,
    /// Largest number of rows one whole tick (every call at one time) may
    /// produce; the flow layer fails a flow that produces more.
    pub output_rows_per_tick: u64,
    /// Largest operator state in bytes (as the guest reports it); the flow
    /// layer fails a flow whose state grows past it. `None`: only the memory
    /// cap bounds it.
    pub state_size: Option<u64>,
}

impl Default for FlowLimits {
    fn default() -> Self {
        FlowLimits {
            memory: 256 << 20,
            cpu_per_call: Duration::from_secs(10),
            // One call returns a tick of up to a million rows whole: the
            // guest need not cut its output, nor the host join the pieces
            // (a back-fill's first tick is often past 100,000 rows). What
            // one call may return is bounded by the guest's memory anyway.
            max_output_rows: 1_000_000,
            output_rows_per_tick: DEFAULT_OUTPUT_ROWS_PER_TICK,
            state_size: None,
        }
    }
}

/// Default bound on the rows one tick of a flow may produce.
pub const DEFAULT_OUTPUT_ROWS_PER_TICK: u64 = 10_000_000;

/// The granularity of CPU budgets: the epoch advances this often.
const EPOCH_TICK: Duration = Duration::from_millis(5);

/// One wasm engine, the components registered in it, and the flows' stores;
/// see the crate docs.
pub struct Sandbox {
    engine: Engine,
    linker: Linker<GuestState>,
    components: RwLock<HashMap<Digest, FlowEnginePre<GuestState>>>,
    config: RuntimeConfig,
    stop_ticker: Arc<AtomicBool>,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox").finish_non_exhaustive()
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        self.stop_ticker.store(true, Ordering::Relaxed);
    }
}

impl Sandbox {
    /// A sandbox with no components yet.
    pub fn new(config: RuntimeConfig) -> Result<Sandbox, RuntimeError> {
        let engine = make_engine(&config)?;
        let mut linker = Linker::<GuestState>::new(&engine);
        wasi::add_wasi(&mut linker)?;
        let stop_ticker = Arc::new(AtomicBool::new(false));
        if config.epochs == Epochs::Ticker {
            spawn_epoch_ticker(engine.clone(), stop_ticker.clone());
        }
        Ok(Sandbox {
            engine,
            linker,
            components: RwLock::new(HashMap::new()),
            config,
            stop_ticker,
        })
    }

    /// Compiles a component (or loads its compiled form from the cache) and
    /// checks that it is a flow component whose imports the sandbox provides;
    /// registering the same bytes again is free. Returns its digest.
    pub fn register(&self, bytes: &[u8]) -> Result<Digest, RuntimeError> {
        let digest = Digest::of(bytes);
        if self.is_registered(&digest) {
            return Ok(digest);
        }
        let component = component::compile(
            &self.engine,
            bytes,
            &digest,
            self.config.cache_dir.as_deref(),
        )?;
        // Instantiating ahead of time checks every import against the linker:
        // a component that asks for anything beyond the contract is refused here.
        let instance_pre =
            self.linker
                .instantiate_pre(&component)
                .map_err(|e| RuntimeError::Setup {
                    message: format!("component {digest} does not fit the sandbox: {e:#}"),
                })?;
        let pre = FlowEnginePre::new(instance_pre).map_err(|e| RuntimeError::Setup {
            message: format!("component {digest} does not implement the flow contract: {e:#}"),
        })?;
        if let Ok(mut map) = self.components.write() {
            map.insert(digest, pre);
        }
        Ok(digest)
    }

    /// Checks and compiles a component uploaded by a user, registers it, and
    /// returns its digest and its compiled form (to be stored and handed to
    /// [`Sandbox::register_compiled`] after a restart instead of compiling
    /// again).
    ///
    /// Refused, with a message that says why: bytes that are not WebAssembly,
    /// a core module, a component of another world or contract version (it
    /// must export [`FLOW_EXPORT`]), and a component that imports anything
    /// beyond the contract and the stubbed WASI (the message names the
    /// import). Compiling may take long on hostile input: run it off the
    /// request path, with a time bound (see the database's component registry).
    pub fn compile_untrusted(&self, bytes: &[u8]) -> Result<(Digest, Vec<u8>), RuntimeError> {
        check_component_header(bytes)?;
        let digest = Digest::of(bytes);
        let component = wasmtime::component::Component::new(&self.engine, bytes).map_err(|e| {
            RuntimeError::Setup {
                message: format!("the component does not validate or compile: {e:#}"),
            }
        })?;
        let pre = self.check_fits(&component)?;
        let compiled = component.serialize().map_err(|e| RuntimeError::Setup {
            message: format!("cannot serialize the compiled component {digest}: {e:#}"),
        })?;
        if let Ok(mut map) = self.components.write() {
            map.insert(digest, pre);
        }
        Ok((digest, compiled))
    }

    /// Registers a component from the compiled form that
    /// [`Sandbox::compile_untrusted`] returned, without compiling it again.
    /// Fails (and the caller compiles again) when the form was made by
    /// another wasmtime version or engine settings.
    ///
    /// # Safety
    ///
    /// `compiled` must be bytes that `compile_untrusted` of a sandbox returned
    /// for the component whose digest is `digest`, unaltered: wasmtime runs
    /// the machine code in them as it is. The database keeps them in its own
    /// storage with their SHA-256 and checks it before calling this.
    pub unsafe fn register_compiled(
        &self,
        digest: Digest,
        compiled: &[u8],
    ) -> Result<(), RuntimeError> {
        if self.is_registered(&digest) {
            return Ok(());
        }
        // SAFETY: the caller's contract (see above).
        let component =
            unsafe { wasmtime::component::Component::deserialize(&self.engine, compiled) }
                .map_err(|e| RuntimeError::Setup {
                    message: format!("cannot load the compiled component {digest}: {e:#}"),
                })?;
        let pre = self.check_fits(&component)?;
        if let Ok(mut map) = self.components.write() {
            map.insert(digest, pre);
        }
        Ok(())
    }

    /// A number that changes when compiled forms of this sandbox's engine
    /// stop being loadable (another wasmtime version or settings).
    pub fn compatibility_hash(&self) -> u64 {
        let mut hasher = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(&self.engine.precompile_compatibility_hash(), &mut hasher);
        std::hash::Hasher::finish(&hasher)
    }

    /// The component's imports are all provided and it exports the contract.
    fn check_fits(
        &self,
        component: &wasmtime::component::Component,
    ) -> Result<FlowEnginePre<GuestState>, RuntimeError> {
        let ty = component.component_type();
        for (name, _) in ty.imports(&self.engine) {
            if let Some(version) = name
                .strip_prefix("sandflow:flow/")
                .and_then(|rest| rest.split_once('@'))
                .map(|(_, version)| version)
                .filter(|v| *v != FLOW_WORLD_VERSION)
            {
                return Err(RuntimeError::Setup {
                    message: format!(
                        "the component imports `{name}`: it was built against version {version} \
                         of sandflow's flow contract, and this server speaks {FLOW_PACKAGE} \
                         (wit/flow.wit); rebuild it against that version"
                    ),
                });
            }
            if !import_allowed(name) {
                return Err(RuntimeError::Setup {
                    message: format!(
                        "the component imports `{name}`, which a flow component may not use: it \
                         may import only {FLOW_PACKAGE}'s types and the WASI interfaces that \
                         language runtimes need ({}), which the sandbox stubs (no files, \
                         sockets, real clocks or randomness); build it without that dependency \
                         (componentize-py: --stub-wasi)",
                        ALLOWED_IMPORTS.join(", ")
                    ),
                });
            }
        }
        let instance_pre =
            self.linker
                .instantiate_pre(component)
                .map_err(|e| RuntimeError::Setup {
                    message: format!(
                        "the component imports something the sandbox does not provide ({e:#}); a \
                         flow component may import only {FLOW_PACKAGE}'s types and the stubbed \
                         WASI interfaces (no files, sockets or other capabilities)"
                    ),
                })?;
        FlowEnginePre::new(instance_pre).map_err(|e| RuntimeError::Setup {
            message: format!(
                "the component is not a flow component of {FLOW_PACKAGE}: it must export \
                 {FLOW_EXPORT} with the functions of wit/flow.wit ({e:#})"
            ),
        })
    }

    /// Whether a component with this digest is registered.
    pub fn is_registered(&self, digest: &Digest) -> bool {
        self.components.read().is_ok_and(|m| m.contains_key(digest))
    }

    /// Advances the epoch by one (see [`Epochs::Manual`]); a call whose
    /// budget is `n` epochs traps on the `n`-th advance while it runs.
    pub fn advance_epoch(&self) {
        self.engine.increment_epoch();
    }

    /// How long one epoch lasts with [`Epochs::Ticker`].
    pub const EPOCH: Duration = EPOCH_TICK;

    /// Instantiates a new flow of `component` from a Substrait plan.
    pub fn create_flow(
        &self,
        component: &Digest,
        plan: &[u8],
        sources: &[SourceSchema],
        options: &[(String, String)],
        limits: FlowLimits,
    ) -> Result<FlowInstance, RuntimeError> {
        let mut inst = self.instantiate(component, limits)?;
        let sources: Vec<_> = sources.iter().map(convert::source_to_wit).collect();
        let handle = inst.setup_call(|bindings, store| {
            bindings
                .sandflow_flow_engine()
                .flow()
                .call_create(store, plan, &sources, options)
        })?;
        inst.handle = Some(handle);
        inst.load_output_schema()?;
        Ok(inst)
    }

    /// Instantiates a flow of `component` from a snapshot taken by
    /// [`FlowInstance::snapshot`].
    pub fn restore_flow(
        &self,
        component: &Digest,
        state: &[u8],
        limits: FlowLimits,
    ) -> Result<FlowInstance, RuntimeError> {
        let mut inst = self.instantiate(component, limits)?;
        let handle = inst.setup_call(|bindings, store| {
            bindings
                .sandflow_flow_engine()
                .flow()
                .call_restore(store, state)
        })?;
        inst.handle = Some(handle);
        inst.load_output_schema()?;
        Ok(inst)
    }

    fn instantiate(
        &self,
        component: &Digest,
        limits: FlowLimits,
    ) -> Result<FlowInstance, RuntimeError> {
        let pre = self
            .components
            .read()
            .ok()
            .and_then(|m| m.get(component).cloned())
            .ok_or_else(|| RuntimeError::Setup {
                message: format!("no component {component} is registered in the sandbox"),
            })?;
        if limits.memory > self.config.max_memory_limit {
            return Err(RuntimeError::Setup {
                message: format!(
                    "memory limit {} exceeds the server's maximum of {} bytes",
                    limits.memory, self.config.max_memory_limit
                ),
            });
        }
        let mut store = Store::new(&self.engine, GuestState::new(limits.memory));
        store.limiter(|state| &mut state.limiter);
        store.epoch_deadline_trap();
        store.set_epoch_deadline(budget_ticks(setup_budget(limits)));
        let bindings = pre
            .instantiate(&mut store)
            .map_err(|e| classify_trap(e, &store, limits))?;
        Ok(FlowInstance {
            store,
            bindings,
            handle: None,
            limits,
            output_schema: Vec::new(),
            failed: None,
        })
    }
}

/// Setting up an instance (instantiate, create or restore, output schema)
/// gets at least this budget: a tight per-tick budget must not fail the
/// setup because an epoch happened to tick during it.
const MIN_SETUP_BUDGET: Duration = Duration::from_secs(5);

fn setup_budget(limits: FlowLimits) -> Duration {
    limits.cpu_per_call.max(MIN_SETUP_BUDGET)
}

/// Epochs until the deadline. The epoch advances on its own clock, so the
/// first one may come at once: one more than the budget needs means a call
/// always gets at least its budget (and at most one `EPOCH_TICK` more).
fn budget_ticks(budget: Duration) -> u64 {
    budget.as_nanos().div_ceil(EPOCH_TICK.as_nanos()) as u64 + 1
}

fn make_engine(config: &RuntimeConfig) -> Result<Engine, RuntimeError> {
    let strategy = match config.pool {
        Some(slots) => {
            // A slot per flow. A component of a language runtime has many
            // core instances and tables and a few memories (componentize-py's
            // CPython: about twenty instances and two memories), so each
            // slot gets room for them; unused memory slots reserve only
            // address space.
            let mut pool = wasmtime::PoolingAllocationConfig::default();
            pool.total_component_instances(slots)
                .total_core_instances(slots.saturating_mul(32))
                .total_memories(slots.saturating_mul(4))
                .total_tables(slots.saturating_mul(32))
                .total_stacks(slots)
                .max_memory_size(config.max_memory_limit);
            wasmtime::InstanceAllocationStrategy::Pooling(pool)
        }
        None => wasmtime::InstanceAllocationStrategy::OnDemand,
    };
    let mut wasm = Config::new();
    // Memories of our own making, on demand: wasmtime's layout with huge
    // pages (memory.rs). They take their data segments by copy, not as a
    // copy-on-write image (sandflow's engine has 400 KiB of them).
    #[cfg(target_os = "linux")]
    if config.pool.is_none() {
        wasm.with_host_memory(Arc::new(memory::HugePageMemories::default()))
            .memory_init_cow(false);
    }
    wasm.wasm_component_model(true)
        .epoch_interruption(true)
        .allocation_strategy(strategy)
        // Deep recursion in a guest ends in a trap, not in the host's stack.
        .max_wasm_stack(1 << 20)
        .cranelift_opt_level(wasmtime::OptLevel::Speed);
    // For profiling the guest with `perf`: writes /tmp/perf-<pid>.map so that
    // samples in compiled guest code get the guest's function names.
    if std::env::var_os("SANDFLOW_WASM_PERFMAP").is_some() {
        wasm.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
    Engine::new(&wasm).map_err(|e| RuntimeError::Setup {
        message: format!("cannot create the wasm engine: {e:#}"),
    })
}

/// Advances the engine's epoch every `EPOCH_TICK` so that per-call deadlines
/// (counted in epochs) stop runaway guests. Ends when the runtime is dropped.
fn spawn_epoch_ticker(engine: Engine, stop: Arc<AtomicBool>) {
    let weak = engine.weak();
    drop(engine);
    std::thread::Builder::new()
        .name("sandflow-epoch".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(EPOCH_TICK);
                match weak.upgrade() {
                    Some(engine) => engine.increment_epoch(),
                    None => break,
                }
            }
        })
        .ok();
}

fn classify_trap(
    error: wasmtime::Error,
    store: &Store<GuestState>,
    limits: FlowLimits,
) -> RuntimeError {
    if store.data().limiter.hit {
        return RuntimeError::MemoryLimit {
            limit: limits.memory,
        };
    }
    if let Some(trap) = error.downcast_ref::<wasmtime::Trap>() {
        if *trap == wasmtime::Trap::Interrupt {
            return RuntimeError::CpuLimit {
                budget: limits.cpu_per_call,
            };
        }
    }
    let mut message = format!("{error:#}");
    let stderr = store.data().stderr_text();
    if !stderr.is_empty() {
        message = format!("{message}; guest said: {stderr}");
    }
    RuntimeError::Trap { message }
}

/// One flow's sandbox: its store, its instance and its `flow` resource.
pub struct FlowInstance {
    store: Store<GuestState>,
    bindings: FlowEngine,
    handle: Option<ResourceAny>,
    limits: FlowLimits,
    output_schema: Vec<Field>,
    failed: Option<RuntimeError>,
}

impl FlowInstance {
    /// Runs one call into the guest with a fresh CPU budget; any failure poisons
    /// the instance.
    fn call<T>(
        &mut self,
        f: impl FnOnce(
            &FlowEngine,
            &mut Store<GuestState>,
        ) -> wasmtime::Result<Result<T, convert::WitFlowError>>,
    ) -> Result<T, RuntimeError> {
        self.call_with_budget(self.limits.cpu_per_call, f)
    }

    /// A setup call (create, restore, output schema): see [`MIN_SETUP_BUDGET`].
    fn setup_call<T>(
        &mut self,
        f: impl FnOnce(
            &FlowEngine,
            &mut Store<GuestState>,
        ) -> wasmtime::Result<Result<T, convert::WitFlowError>>,
    ) -> Result<T, RuntimeError> {
        self.call_with_budget(setup_budget(self.limits), f)
    }

    fn call_with_budget<T>(
        &mut self,
        budget: Duration,
        f: impl FnOnce(
            &FlowEngine,
            &mut Store<GuestState>,
        ) -> wasmtime::Result<Result<T, convert::WitFlowError>>,
    ) -> Result<T, RuntimeError> {
        if let Some(failed) = &self.failed {
            return Err(RuntimeError::Poisoned {
                message: failed.to_string(),
            });
        }
        self.store.set_epoch_deadline(budget_ticks(budget));
        let result = match f(&self.bindings, &mut self.store) {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(error)) => RuntimeError::Guest {
                error: convert::error_from_wit(error),
            },
            Err(trap) => classify_trap(trap, &self.store, self.limits),
        };
        // A guest error leaves the instance usable only for errors about the
        // input (the guest rejected it before touching state); everything else
        // poisons it.
        if !matches!(
            result,
            RuntimeError::Guest {
                error: FlowError::BadInput(_)
            }
        ) {
            self.failed = Some(result.clone());
        }
        Err(result)
    }

    fn handle(&self) -> Result<ResourceAny, RuntimeError> {
        self.handle.ok_or_else(|| RuntimeError::Poisoned {
            message: "flow was never created".into(),
        })
    }

    /// The limits this instance runs under.
    pub fn limits(&self) -> FlowLimits {
        self.limits
    }

    /// The error that failed this instance, if any.
    pub fn failure(&self) -> Option<&RuntimeError> {
        self.failed.as_ref()
    }

    /// The columns of the flow's output.
    pub fn output_schema(&self) -> &[Field] {
        &self.output_schema
    }

    fn load_output_schema(&mut self) -> Result<(), RuntimeError> {
        let handle = self.handle()?;
        let fields = self.setup_call(|bindings, store| {
            bindings
                .sandflow_flow_engine()
                .flow()
                .call_output_schema(store, handle)
                .map(Ok)
        })?;
        self.output_schema = fields
            .into_iter()
            .map(convert::field_from_wit)
            .collect::<Result<_, _>>()?;
        Ok(())
    }

    /// Pushes diff rows of source `source`.
    pub fn push(&mut self, source: u32, batch: Batch) -> Result<(), RuntimeError> {
        let handle = self.handle()?;
        let batch = convert::batch_to_wit(batch);
        self.call(|bindings, store| {
            bindings
                .sandflow_flow_engine()
                .flow()
                .call_push(store, handle, source, &batch)
        })
    }

    /// Ticks the flow at `now`; returns its output changes (at most
    /// `limits.max_output_rows` rows) after checking them against the contract.
    pub fn tick(&mut self, now: i64) -> Result<TickOutput, RuntimeError> {
        let handle = self.handle()?;
        let max_rows = self.limits.max_output_rows;
        let output = self.call(|bindings, store| {
            bindings
                .sandflow_flow_engine()
                .flow()
                .call_tick(store, handle, now, max_rows)
        })?;
        let mut output = convert::tick_output_from_wit(output);
        if let Err(error) = convert::validate_output(&output, &self.output_schema, max_rows) {
            self.failed = Some(error.clone());
            return Err(error);
        }
        output.expand();
        Ok(output)
    }

    /// The lines the guest wrote to stdout and stderr since the last call,
    /// at most [`LOG_LINES`] (the rest counted as dropped).
    pub fn take_log(&self) -> GuestLog {
        self.store.data().take_log()
    }

    /// Serialises the flow's state.
    pub fn snapshot(&mut self) -> Result<Vec<u8>, RuntimeError> {
        let handle = self.handle()?;
        self.call(|bindings, store| {
            bindings
                .sandflow_flow_engine()
                .flow()
                .call_snapshot(store, handle)
        })
    }

    /// Approximate bytes of operator state, as the guest reports it.
    pub fn state_size(&mut self) -> Result<u64, RuntimeError> {
        let handle = self.handle()?;
        self.call(|bindings, store| {
            bindings
                .sandflow_flow_engine()
                .flow()
                .call_state_size(store, handle)
                .map(Ok)
        })
    }

    /// Bytes of linear memory the instance holds right now.
    pub fn memory_size(&self) -> usize {
        self.store.data().limiter.current
    }
}

#[cfg(test)]
mod tests {
    use super::import_allowed;

    #[test]
    fn only_the_contract_and_the_stubbed_wasi_families_may_be_imported() {
        for ok in [
            "sandflow:flow/types@0.2.0",
            "sandflow:flow/types",
            "wasi:cli/stdout@0.2.6",
            "wasi:io/streams@0.2.9",
            "wasi:clocks/wall-clock@0.2.0",
            "wasi:random/insecure-seed@0.2.6",
        ] {
            assert!(import_allowed(ok), "{ok}");
        }
        for refused in [
            "wasi:filesystem/types@0.2.6",
            "wasi:filesystem/preopens@0.2.9",
            "wasi:sockets/tcp@0.2.6",
            "wasi:http/outgoing-handler@0.2.0",
            "wasi:cli",
            "wasi:cli/",
            "sandflow:flow/typesx@0.2.0",
            "sandflow:flow/engine@0.3.0",
            "evil:net/socket",
            "",
        ] {
            assert!(!import_allowed(refused), "{refused}");
        }
    }
}
