//! The service key's `Parameters` (REG_DWORD values the test sets before DriverEntry).

use std::collections::HashMap;

#[derive(Default)]
pub struct Registry {
    /// The key exists (a service installed by the INF has it).
    pub exists: bool,
    pub values: HashMap<String, u32>,
    /// Names read, in order.
    pub read: Vec<String>,
}

/// Sets `Parameters\name` (and makes the key).
pub fn set(name: &str, value: u32) {
    let mut guard = crate::state::lock();
    guard.registry.exists = true;
    guard.registry.values.insert(name.to_string(), value);
}

/// The values the driver read, in order.
pub fn read() -> Vec<String> {
    crate::state::lock().registry.read.clone()
}
