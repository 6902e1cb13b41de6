//! Ke, Ex, Ps and Mm: IRQL, spin locks, events, rundown protection, time, processors, the
//! bug check, and cng's BCryptGenRandom.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::state::{self, changed};
use crate::thread::{self, APC, DISPATCH, KernelCode, PASSIVE, require_irql};
use crate::verifier::{Rule, bugcheck};
use crate::{
    BOOLEAN, EVENT_TYPE, HANDLE, KIRQL, KPRIORITY, KPROCESSOR_MODE, KWAIT_REASON, LONG, NTSTATUS,
    PEX_RUNDOWN_REF, PKSPIN_LOCK, PLARGE_INTEGER, PPROCESSOR_NUMBER, PRKEVENT, PVOID,
    STATUS_SUCCESS, STATUS_TIMEOUT, ULONG, ULONG_PTR, ULONG64, USHORT,
};

/// How long a processor may spin on a spin lock before the simulation calls it the DPC
/// watchdog (bug check 0x133 fires after about 120 s on Windows).
const SPIN_WATCHDOG: Duration = Duration::from_secs(20);

#[unsafe(no_mangle)]
pub unsafe extern "C" fn KeGetCurrentIrql() -> KIRQL {
    thread::irql()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn KeAcquireSpinLockRaiseToDpc(SpinLock: PKSPIN_LOCK) -> KIRQL {
    let _k = KernelCode::enter();
    require_irql("KeAcquireSpinLockRaiseToDpc", DISPATCH);
    let address = SpinLock as usize;
    if thread::holds(address) {
        bugcheck(
            Rule::SpinLockRecursive,
            format_args!("spin lock {address:#x} acquired again by the thread that holds it"),
        );
    }
    // Nesting order only matters (and the held list is only built) when nesting.
    if thread::held_locks() > 0 {
        crate::lockorder::acquiring(address, &thread::held());
    }
    // SAFETY: a KSPIN_LOCK (ULONG_PTR) the driver keeps in nonpaged memory, aligned.
    let word = unsafe { AtomicU64::from_ptr(SpinLock) };
    let me = u64::from(thread::processor()) + 1;
    let start = Instant::now();
    while word
        .compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        if start.elapsed() > SPIN_WATCHDOG {
            bugcheck(
                Rule::SpinLockWatchdog,
                format_args!(
                    "spun {} s on spin lock {address:#x} held by processor {}",
                    SPIN_WATCHDOG.as_secs(),
                    word.load(Ordering::Relaxed).wrapping_sub(1)
                ),
            );
        }
        std::thread::yield_now();
    }
    let old = thread::irql();
    thread::push_held(address, old);
    thread::set_irql(DISPATCH);
    old
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn KeReleaseSpinLock(SpinLock: PKSPIN_LOCK, NewIrql: KIRQL) {
    let _k = KernelCode::enter();
    let address = SpinLock as usize;
    let Some(old) = thread::pop_held(address) else {
        bugcheck(
            Rule::SpinLockNotHeld,
            format_args!("spin lock {address:#x} released by a thread that does not hold it"),
        );
    };
    if thread::irql() != DISPATCH {
        bugcheck(
            Rule::SpinLockReleaseIrql,
            format_args!(
                "spin lock {address:#x} released at IRQL {} (held at DISPATCH_LEVEL)",
                thread::irql()
            ),
        );
    }
    if NewIrql != old {
        bugcheck(
            Rule::SpinLockReleaseIrql,
            format_args!(
                "spin lock {address:#x} released to IRQL {NewIrql}; it was acquired from IRQL {old}"
            ),
        );
    }
    // SAFETY: as in the acquire.
    let word = unsafe { AtomicU64::from_ptr(SpinLock) };
    word.store(0, Ordering::Release);
    if NewIrql < DISPATCH && thread::held_locks() > 0 {
        // Released out of order: the outer lock first, to below DISPATCH_LEVEL, with an
        // inner one still held.
        bugcheck(
            Rule::IrqlChange,
            format_args!(
                "spin lock {address:#x} released to IRQL {NewIrql} with {} other spin lock(s) still held",
                thread::held_locks()
            ),
        );
    }
    thread::set_irql(NewIrql);
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn KfRaiseIrql(NewIrql: KIRQL) -> KIRQL {
    let old = thread::irql();
    if NewIrql < old {
        bugcheck(
            Rule::IrqlChange,
            format_args!("KeRaiseIrql to {NewIrql} from the higher IRQL {old}"),
        );
    }
    thread::set_irql(NewIrql);
    old
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn KeLowerIrql(NewIrql: KIRQL) {
    let now = thread::irql();
    if NewIrql > now {
        bugcheck(
            Rule::IrqlChange,
            format_args!("KeLowerIrql to {NewIrql} from the lower IRQL {now}"),
        );
    }
    if thread::held_locks() > 0 && NewIrql < DISPATCH {
        bugcheck(
            Rule::IrqlChange,
            format_args!("KeLowerIrql below DISPATCH_LEVEL with a spin lock held"),
        );
    }
    thread::set_irql(NewIrql);
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn KeInitializeEvent(Event: PRKEVENT, Type: EVENT_TYPE, State: BOOLEAN) {
    let _k = KernelCode::enter();
    // SAFETY: the driver's KEVENT.
    unsafe { (*Event).Header.SignalState = i32::from(State) };
    state::lock().events.insert(
        Event as usize,
        (State != 0, Type == crate::_EVENT_TYPE::SynchronizationEvent),
    );
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn KeSetEvent(Event: PRKEVENT, _Increment: KPRIORITY, Wait: BOOLEAN) -> LONG {
    let _k = KernelCode::enter();
    require_irql("KeSetEvent", DISPATCH);
    if Wait != 0 {
        bugcheck(
            Rule::Simulation,
            format_args!("KeSetEvent with Wait = TRUE is not simulated"),
        );
    }
    let mut guard = state::lock();
    let Some(event) = guard.events.get_mut(&(Event as usize)) else {
        drop(guard);
        bugcheck(
            Rule::Simulation,
            format_args!("KeSetEvent on an event never initialised"),
        );
    };
    let previous = event.0;
    event.0 = true;
    drop(guard);
    changed();
    LONG::from(previous)
}

/// A relative timeout (negative 100 ns units); None waits without limit.
fn relative(timeout: PLARGE_INTEGER, function: &str) -> Option<Duration> {
    if timeout.is_null() {
        return None;
    }
    // SAFETY: the driver's LARGE_INTEGER.
    let t = unsafe { *timeout };
    // SAFETY: every arm of the union is a 64-bit integer.
    let t = unsafe { t.QuadPart };
    if t > 0 {
        bugcheck(
            Rule::Simulation,
            format_args!("{function}: absolute timeouts are not simulated"),
        );
    }
    Some(Duration::from_nanos(t.unsigned_abs().saturating_mul(100)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn KeWaitForSingleObject(
    Object: PVOID,
    _WaitReason: KWAIT_REASON,
    _WaitMode: KPROCESSOR_MODE,
    _Alertable: BOOLEAN,
    Timeout: PLARGE_INTEGER,
) -> NTSTATUS {
    let _k = KernelCode::enter();
    let limit = relative(Timeout, "KeWaitForSingleObject");
    let level = thread::irql();
    if level > DISPATCH || (level == DISPATCH && limit != Some(Duration::ZERO)) {
        bugcheck(
            Rule::WaitAtDispatch,
            format_args!("KeWaitForSingleObject at IRQL {level} with a non-zero timeout"),
        );
    }
    let key = Object as usize;
    let what = || format!("the event {key:#x} (KeWaitForSingleObject)");
    let guard = state::lock();
    // Time spent in timed-out waits on the same event counts too: a loop of 10 s waits
    // that never ends is a wait that never returns.
    let (mut guard, signalled) = state::wait_until(guard, limit, &what, |s| {
        s.events.get(&key).is_some_and(|e| e.0)
    });
    if !signalled {
        let total = guard.waited.entry(key).or_default();
        *total += limit.unwrap_or_default();
        if *total >= state::hang_limit() {
            let total = *total;
            drop(guard);
            bugcheck(
                Rule::WaitNeverReturns,
                format_args!("{} s of timed-out waits for {}", total.as_secs(), what()),
            );
        }
        return STATUS_TIMEOUT;
    }
    guard.waited.remove(&key);
    if let Some(e) = guard.events.get_mut(&key)
        && e.1
    {
        e.0 = false;
    }
    STATUS_SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn KeDelayExecutionThread(
    _WaitMode: KPROCESSOR_MODE,
    _Alertable: BOOLEAN,
    Interval: PLARGE_INTEGER,
) -> NTSTATUS {
    let _k = KernelCode::enter();
    require_irql("KeDelayExecutionThread", APC);
    let d = relative(Interval, "KeDelayExecutionThread").unwrap_or_default();
    std::thread::sleep(d);
    STATUS_SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn KeStallExecutionProcessor(MicroSeconds: ULONG) {
    let until = Instant::now() + Duration::from_micros(u64::from(MicroSeconds));
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

fn boot_time() -> Instant {
    static BOOT: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *BOOT.get_or_init(Instant::now)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn KeQueryInterruptTimePrecise(QpcTimeStamp: *mut ULONG64) -> ULONG64 {
    let ticks = (boot_time().elapsed().as_nanos() / 100) as u64 + 10_000_000;
    if !QpcTimeStamp.is_null() {
        // SAFETY: the caller's out pointer.
        unsafe { *QpcTimeStamp = ticks };
    }
    ticks
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn PsGetCurrentThreadId() -> HANDLE {
    if thread::is_idle_thread() {
        // DPCs that interrupted an idle processor run in its idle thread: ID 0 everywhere.
        return core::ptr::null_mut();
    }
    (u64::from(thread::processor()) * 4 + 4) as HANDLE
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn KeQueryActiveProcessorCountEx(_GroupNumber: USHORT) -> ULONG {
    thread::PROCESSORS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn KeGetCurrentProcessorNumberEx(ProcNumber: PPROCESSOR_NUMBER) -> ULONG {
    let n = thread::processor();
    if !ProcNumber.is_null() {
        // SAFETY: the caller's out pointer.
        unsafe {
            *ProcNumber = crate::PROCESSOR_NUMBER {
                Group: 0,
                Number: n as u8,
                Reserved: 0,
            };
        }
    }
    n
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn KeBugCheckEx(
    BugCheckCode: ULONG,
    P1: ULONG_PTR,
    P2: ULONG_PTR,
    P3: ULONG_PTR,
    P4: ULONG_PTR,
) -> ! {
    bugcheck(
        Rule::Simulation,
        format_args!("KeBugCheckEx({BugCheckCode:#x}, {P1:#x}, {P2:#x}, {P3:#x}, {P4:#x})"),
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ExInitializeRundownProtection(RunRef: PEX_RUNDOWN_REF) {
    let _k = KernelCode::enter();
    state::lock().rundowns.insert(RunRef as usize, (0, false));
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ExAcquireRundownProtection(RunRef: PEX_RUNDOWN_REF) -> BOOLEAN {
    let _k = KernelCode::enter();
    require_irql("ExAcquireRundownProtection", DISPATCH);
    let mut guard = state::lock();
    let Some(r) = guard.rundowns.get_mut(&(RunRef as usize)) else {
        drop(guard);
        bugcheck(
            Rule::Rundown,
            format_args!("rundown protection {RunRef:p} never initialised"),
        );
    };
    if r.1 {
        return 0;
    }
    r.0 += 1;
    1
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ExReleaseRundownProtection(RunRef: PEX_RUNDOWN_REF) {
    let _k = KernelCode::enter();
    require_irql("ExReleaseRundownProtection", DISPATCH);
    let mut guard = state::lock();
    match guard.rundowns.get_mut(&(RunRef as usize)) {
        Some(r) if r.0 > 0 => r.0 -= 1,
        _ => {
            drop(guard);
            bugcheck(
                Rule::Rundown,
                format_args!("rundown protection {RunRef:p} released more often than acquired"),
            );
        }
    }
    drop(guard);
    changed();
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ExWaitForRundownProtectionRelease(RunRef: PEX_RUNDOWN_REF) {
    let _k = KernelCode::enter();
    require_irql("ExWaitForRundownProtectionRelease", APC);
    let key = RunRef as usize;
    let mut guard = state::lock();
    match guard.rundowns.get_mut(&key) {
        Some(r) => r.1 = true,
        None => {
            drop(guard);
            bugcheck(
                Rule::Rundown,
                format_args!("rundown protection {RunRef:p} never initialised"),
            );
        }
    }
    let what = || format!("rundown protection {key:#x} to be released");
    let _ = state::wait_until(guard, None, &what, |s| {
        s.rundowns.get(&key).is_none_or(|r| r.0 == 0)
    });
}

/// cng.sys `BCryptGenRandom` (`BCRYPT_USE_SYSTEM_PREFERRED_RNG`, PASSIVE_LEVEL): the
/// simulation's generator is seeded per process from the clock (scenarios need no
/// cryptographic randomness, only distinct engines).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn BCryptGenRandom(
    _Algorithm: PVOID,
    Buffer: *mut u8,
    Length: ULONG,
    Flags: ULONG,
) -> NTSTATUS {
    let _k = KernelCode::enter();
    require_irql("BCryptGenRandom", PASSIVE);
    if Flags != 2 {
        bugcheck(
            Rule::Simulation,
            format_args!("BCryptGenRandom flags {Flags:#x}"),
        );
    }
    static SEED: AtomicU64 = AtomicU64::new(0x9E37_79B9_7F4A_7C15);
    let mut x = SEED.fetch_add(
        boot_time().elapsed().as_nanos() as u64 | 1,
        Ordering::Relaxed,
    );
    for i in 0..Length as usize {
        // splitmix64 step per 8 bytes
        if i % 8 == 0 {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        }
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        // SAFETY: `i` < `Length`, inside the caller's buffer.
        let byte = unsafe { Buffer.add(i) };
        // SAFETY: as above.
        unsafe { *byte = (z >> ((i % 8) * 8)) as u8 };
    }
    STATUS_SUCCESS
}
