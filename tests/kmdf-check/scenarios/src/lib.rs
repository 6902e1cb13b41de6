//! What the binding's scenarios share: a peer on the simulated fabric, and the user
//! library's transport over the simulated I/O manager.

pub mod peer;
pub mod user_mode;
