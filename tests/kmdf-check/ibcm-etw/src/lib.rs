//! Stand-in for ibcm-etw's Windows API (the real crate is type-checked for
//! x86_64-pc-windows-msvc by .ci/windows-check); same signatures.
#![no_std]
use ibcm_cep::{Level, TracePoint, Tracer};
use ibcm_endpoint::{DispatchPoint, DispatchTracer};
/// # Safety
/// As the real crate.
pub unsafe fn register() {}
pub fn unregister() {}
pub static ETW: EtwSink = EtwSink;
pub struct EtwSink;
impl Tracer for EtwSink {
    fn enabled(&self, _level: Level) -> bool {
        false
    }
    fn trace(&self, _ca_guid: u64, _point: &TracePoint<'_>) {}
}
impl DispatchTracer for EtwSink {
    fn dispatch(&self, _point: &DispatchPoint) {}
}
pub fn cm_interface_query(_ca_guid: u64, _version: u16, _size: u16, _answered: bool, _reason: &str) {}
pub fn qp1_route(_ca_guid: u64, _routed: bool, _route: &str, _reason: &str) {}
pub fn refused(_quota_exceeded: u64, _forged: u64) {}
